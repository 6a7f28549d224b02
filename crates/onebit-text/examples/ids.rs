//! `ids MODEL.gguf < strings.json`: a JSON array of strings in, one JSON array
//! of ids per string out (BOS as the model adds it, special tokens parsed). For
//! comparing against other tokenizers on corpora larger than the test references.

use std::io::Read;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: ids MODEL.gguf < strings.json")?;
    let g = onebit_formats::gguf::Gguf::open(&path)?;
    let t = onebit_text::Tokenizer::from_gguf(&g)?;
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let texts: Vec<String> = serde_json::from_str(&input)?;
    let mut out = Vec::with_capacity(texts.len());
    for s in &texts {
        out.push(t.encode(s, true)?);
    }
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}
