//! A LongRoPE model's `[semantics]` RoPE line names the factor table the run
//! uses: the short one up to the original training context, the long one
//! above it (llama.cpp's rule, by context size), and the forward uses the
//! table the line names. On the phi3 fixture (original context 4096,
//! trained context 131072).

use onebit_kernels::Precision;
use onebit_model::{load, ExecConfig, Logits};
use onebit_testdata::Fixture;

const SHORT: &str = "rope_factors_short.weight";
const LONG: &str = "rope_factors_long.weight";

fn rope_line(lines: &[String]) -> String {
    lines
        .iter()
        .find(|l| l.starts_with("rope full:"))
        .expect("a rope full line")
        .clone()
}

#[test]
fn the_rope_line_names_the_table_the_context_selects() {
    let sem = load::open(&Fixture::new("phi3").dir.join("f32.gguf"))
        .unwrap()
        .sem;
    // Within the original context (4096): the short table.
    let s = sem.at_context(4096);
    assert_eq!(s.rope_full.value.freq_factors.as_deref(), Some(SHORT));
    let line = rope_line(&s.lines());
    assert!(
        line.contains(&format!("factors from {SHORT}"))
            && line.contains("within the original 4096"),
        "{line}"
    );
    // One past it, and at the trained context (the default): the long table.
    for ctx in [4097, 131072] {
        let s = sem.at_context(ctx);
        assert_eq!(s.rope_full.value.freq_factors.as_deref(), Some(LONG));
        let line = rope_line(&s.lines());
        assert!(
            line.contains(&format!("factors from {LONG}"))
                && line.contains("exceeds the original 4096"),
            "{ctx}: {line}"
        );
    }
}

#[test]
fn the_forward_uses_the_table_the_line_names() {
    let path = Fixture::new("phi3").dir.join("f32.gguf");
    let run = |max_context| {
        let exec = ExecConfig {
            threads: 2,
            precision: Precision::Quantized,
            max_context,
            ..ExecConfig::default()
        };
        let (m, _) = load::load(&path, &exec).unwrap();
        let mut st = m.new_state();
        let logits = m.forward(&mut st, &[5, 9, 200, 17], Logits::Last).unwrap();
        (m.sem.rope_full.value.freq_factors.clone(), logits)
    };
    let (short, a) = run(128);
    let (long, b) = run(0);
    assert_eq!(short.as_deref(), Some(SHORT));
    assert_eq!(long.as_deref(), Some(LONG));
    assert_ne!(a, b, "the long table must change the logits");
}
