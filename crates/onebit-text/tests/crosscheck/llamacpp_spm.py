# Usage: python3 llamacpp_spm.py MODEL.gguf corpus.json  (see README.md)
# Independent re-implementation of llama.cpp's SPM tokenizer (llm_tokenizer_spm +
# tokenizer_st_partition), to cross-check onebit on larger corpora.
import gguf, heapq, json, sys
r = gguf.GGUFReader(sys.argv[1])
f = r.fields
toks = [bytes(f['tokenizer.ggml.tokens'].parts[i]).decode() for i in f['tokenizer.ggml.tokens'].data]
scores = [float(f['tokenizer.ggml.scores'].parts[i][0]) for i in f['tokenizer.ggml.scores'].data]
types = [int(f['tokenizer.ggml.token_type'].parts[i][0]) for i in f['tokenizer.ggml.token_type'].data]
def kv(k, d=None):
    if k not in f: return d
    return f[k].parts[f[k].data[0]].tolist()[0]
bos = kv('tokenizer.ggml.bos_token_id'); add_bos = kv('tokenizer.ggml.add_bos_token', True)
prefix = kv('tokenizer.ggml.add_space_prefix', True)
t2id = {t: i for i, t in enumerate(toks)}
specials = sorted([i for i, ty in enumerate(types) if ty in (2, 3, 4)], key=lambda i: -len(toks[i].encode()))

def partition(text):
    frags = [text]
    for sid in specials:
        st = toks[sid]
        out = []
        for fr in frags:
            if isinstance(fr, int): out.append(fr); continue
            while True:
                p = fr.find(st)
                if p < 0: break
                if p > 0: out.append(fr[:p])
                out.append(sid)
                fr = fr[p + len(st):]
            if fr: out.append(fr)
        frags = out
    return frags

def spm(text):
    sym = list(text)
    n = len(sym)
    prev = list(range(-1, n - 1)); nxt = list(range(1, n + 1)); nxt[-1] = -1 if n else -1
    alive = [True] * n
    heap = []
    def add(l, r):
        if l < 0 or r < 0: return
        s = sym[l] + sym[r]
        if s in t2id:
            heapq.heappush(heap, (-scores[t2id[s]], l, r, s))
    for i in range(n - 1): add(i, i + 1)
    while heap:
        _, l, r, s = heapq.heappop(heap)
        if not alive[l] or not alive[r] or nxt[l] != r or sym[l] + sym[r] != s: continue
        sym[l] = s; alive[r] = False
        nxt[l] = nxt[r]
        if nxt[r] >= 0: prev[nxt[r]] = l
        add(prev[l], l); add(l, nxt[l])
    out = []
    i = 0 if n else -1
    while i >= 0 and i < n:
        if alive[i]:
            s = sym[i]
            if s in t2id: out.append(t2id[s])
            else: out.extend(t2id['<0x%02X>' % b] for b in s.encode())
        i = nxt[i]
    return out

def encode(text):
    out = [bos] if add_bos else []
    prev_special = True
    for fr in partition(text):
        if isinstance(fr, int): out.append(fr); prev_special = True; continue
        t = (' ' if prefix and prev_special else '') + fr
        out += spm(t.replace(' ', '\u2581')); prev_special = False
    return out

texts = json.load(open(sys.argv[2]))
print(json.dumps([encode(t) for t in texts]))
