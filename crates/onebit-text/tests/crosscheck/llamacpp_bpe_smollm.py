# Usage: python3 llamacpp_bpe_smollm.py MODEL.gguf corpus.json  (see README.md)
# Independent re-implementation of llama.cpp's byte-level BPE (smollm pre), to cross-check onebit.
import gguf, json, sys, regex
r = gguf.GGUFReader(sys.argv[1]); f = r.fields
toks = [bytes(f['tokenizer.ggml.tokens'].parts[i]).decode() for i in f['tokenizer.ggml.tokens'].data]
types = [int(f['tokenizer.ggml.token_type'].parts[i][0]) for i in f['tokenizer.ggml.token_type'].data]
merges = [bytes(f['tokenizer.ggml.merges'].parts[i]).decode() for i in f['tokenizer.ggml.merges'].data]
rank = {}
for i, m in enumerate(merges):
    p = m.index(' ', 1); rank.setdefault((m[:p], m[p+1:]), i)
t2id = {t: i for i, t in enumerate(toks)}
specials = sorted([i for i, ty in enumerate(types) if ty in (2, 3, 4)], key=lambda i: -len(toks[i].encode()))
bs = list(range(ord('!'), ord('~')+1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs = bs[:]; n = 0
for b in range(256):
    if b not in bs: bs.append(b); cs.append(256+n); n += 1
b2c = {b: chr(c) for b, c in zip(bs, cs)}
REGEXES = [r"\p{N}", r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"]
def split(pieces, rx):
    out = []
    for p in pieces:
        pos = 0
        for m in regex.finditer(rx, p):
            if m.start() > pos: out.append(p[pos:m.start()])
            if m.end() > m.start(): out.append(m.group())
            pos = m.end()
        if pos < len(p): out.append(p[pos:])
    return out
def bpe(word):
    sym = [b2c[b] for b in word.encode()]
    while len(sym) > 1:
        best = min(((rank.get((sym[i], sym[i+1]), 1 << 30), i) for i in range(len(sym)-1)))
        if best[0] == 1 << 30: break
        i = best[1]; sym[i:i+2] = [sym[i] + sym[i+1]]
    return [t2id[s] for s in sym]
def partition(text):
    frags = [text]
    for sid in specials:
        st = toks[sid]; out = []
        for fr in frags:
            if isinstance(fr, int): out.append(fr); continue
            while True:
                p = fr.find(st)
                if p < 0: break
                if p > 0: out.append(fr[:p])
                out.append(sid); fr = fr[p+len(st):]
            if fr: out.append(fr)
        frags = out
    return frags
def encode(text):
    out = []
    for fr in partition(text):
        if isinstance(fr, int): out.append(fr); continue
        pieces = [fr]
        for rx in REGEXES: pieces = split(pieces, rx)
        for p in pieces: out += bpe(p)
    return out
texts = json.load(open(sys.argv[2]))
print(json.dumps([encode(t) for t in texts]))
