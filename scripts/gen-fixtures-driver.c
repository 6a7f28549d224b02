/*
 * gen-fixtures-driver: runs a GGUF through llama.cpp's public API (libllama)
 * on the CPU and writes the logits of every position as raw little-endian
 * float32, row-major [n_tokens][n_vocab]. Built and called by
 * scripts/gen-fixtures.py; see testdata/llamacpp/README.md for the settings.
 *
 *   gen-fixtures-driver MODE MODEL.gguf OUT.bin TOKEN...
 *
 * MODE: batch       one llama_decode call with every token, KV cache F32,
 *                   flash attention off
 *       sequential  one llama_decode call per token, same settings
 *       kvf16       one call, llama.cpp's default KV type (F16) and flash
 *                   attention "auto"
 *       embed       an embedding model: TOKEN... holds sequences separated by
 *                   "/"; each runs in one llama_decode call of its own (KV
 *                   cache cleared between), embeddings on with the model's own
 *                   pooling, and OUT.bin gets llama_get_embeddings_seq
 *                   (pooled, through any dense head, not normalized),
 *                   [n_sequences][llama_model_n_embd]
 *       sysinfo     print llama_print_system_info() and exit (no other args)
 * Always: n_ctx = n_batch = n_ubatch = 128, 2 threads, seq 0, positions
 * 0..n-1, a fresh context, logits requested for every token.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

/* Loads `path` on the CPU and makes the context every mode uses: n_ctx =
 * n_batch = n_ubatch = 128, 2 threads; `f32_kv` for an F32 KV cache with
 * flash attention off (else llama.cpp's defaults), `embeddings` for pooled
 * output. NULL (after saying why) when llama.cpp refuses. */
static struct llama_context *open_context(const char *path, int f32_kv, int embeddings,
                                          struct llama_model **model) {
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    *model = llama_model_load_from_file(path, mp);
    if (!*model) {
        fprintf(stderr, "error: llama.cpp could not load %s\n", path);
        return NULL;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 128;
    cp.n_batch = 128;
    cp.n_ubatch = 128;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.no_perf = true;
    cp.embeddings = embeddings;
    if (f32_kv) {
        cp.type_k = GGML_TYPE_F32;
        cp.type_v = GGML_TYPE_F32;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    struct llama_context *ctx = llama_init_from_model(*model, cp);
    if (!ctx) {
        fprintf(stderr, "error: llama.cpp could not make a context for %s\n", path);
    }
    return ctx;
}

/* Mode "embed": one pooled embedding per "/"-separated token sequence. */
static int embed(int argc, char **argv) {
    struct llama_model *model = NULL;
    struct llama_context *ctx = open_context(argv[2], 1, 1, &model);
    if (!ctx) {
        return 1;
    }
    int n_embd = llama_model_n_embd(model);
    FILE *f = fopen(argv[3], "wb");
    if (!f) {
        fprintf(stderr, "error: could not write %s\n", argv[3]);
        return 1;
    }
    struct llama_batch b = llama_batch_init(128, 0, 1);
    int i = 4;
    while (i <= argc) {
        b.n_tokens = 0;
        for (; i < argc && strcmp(argv[i], "/") != 0; i++) {
            if (b.n_tokens == 128) {
                fprintf(stderr, "error: a sequence of more than 128 tokens (n_ctx)\n");
                return 2;
            }
            int j = b.n_tokens++;
            b.token[j] = (llama_token)atoi(argv[i]);
            b.pos[j] = j;
            b.n_seq_id[j] = 1;
            b.seq_id[j][0] = 0;
            b.logits[j] = 1;
        }
        i++;
        if (b.n_tokens == 0) {
            fprintf(stderr, "error: an empty sequence\n");
            return 2;
        }
        llama_memory_t mem = llama_get_memory(ctx);
        if (mem) {
            llama_memory_clear(mem, true);
        }
        if (llama_decode(ctx, b) != 0) {
            fprintf(stderr, "error: llama_decode failed\n");
            return 1;
        }
        const float *e = llama_get_embeddings_seq(ctx, 0);
        if (!e || fwrite(e, sizeof(float), (size_t)n_embd, f) != (size_t)n_embd) {
            fprintf(stderr, "error: no pooled embedding, or could not write %s\n", argv[3]);
            return 1;
        }
    }
    fclose(f);
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "sysinfo") == 0) {
        llama_log_set(quiet, NULL);
        llama_backend_init();
        printf("%s\n", llama_print_system_info());
        return 0;
    }
    if (argc < 5) {
        fprintf(stderr, "usage: %s batch|sequential|kvf16|embed MODEL.gguf OUT.bin TOKEN...\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    if (strcmp(mode, "embed") == 0) {
        return embed(argc, argv);
    }
    int batch_mode = strcmp(mode, "batch") == 0;
    int seq_mode = strcmp(mode, "sequential") == 0;
    int kvf16_mode = strcmp(mode, "kvf16") == 0;
    if (!batch_mode && !seq_mode && !kvf16_mode) {
        fprintf(stderr, "error: mode '%s'; expected batch, sequential or kvf16\n", mode);
        return 2;
    }
    int n = argc - 4;
    if (n > 128) {
        fprintf(stderr, "error: %d tokens; at most 128 (n_ctx)\n", n);
        return 2;
    }
    llama_token *tokens = malloc(sizeof(llama_token) * (size_t)n);
    for (int i = 0; i < n; i++) {
        tokens[i] = (llama_token)atoi(argv[4 + i]);
    }

    struct llama_model *model = NULL;
    struct llama_context *ctx = open_context(argv[2], !kvf16_mode, 0, &model);
    if (!ctx) {
        return 1;
    }
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    float *out = malloc(sizeof(float) * (size_t)n * (size_t)n_vocab);

    int per_call = seq_mode ? 1 : n;
    struct llama_batch b = llama_batch_init(per_call, 0, 1);
    for (int start = 0; start < n; start += per_call) {
        b.n_tokens = per_call;
        for (int j = 0; j < per_call; j++) {
            b.token[j] = tokens[start + j];
            b.pos[j] = start + j;
            b.n_seq_id[j] = 1;
            b.seq_id[j][0] = 0;
            b.logits[j] = 1;
        }
        if (llama_decode(ctx, b) != 0) {
            fprintf(stderr, "error: llama_decode failed at token %d\n", start);
            return 1;
        }
        for (int j = 0; j < per_call; j++) {
            const float *l = llama_get_logits_ith(ctx, j);
            memcpy(out + (size_t)(start + j) * (size_t)n_vocab, l, sizeof(float) * (size_t)n_vocab);
        }
    }
    FILE *f = fopen(argv[3], "wb");
    if (!f || fwrite(out, sizeof(float), (size_t)n * (size_t)n_vocab, f) != (size_t)n * (size_t)n_vocab) {
        fprintf(stderr, "error: could not write %s\n", argv[3]);
        return 1;
    }
    fclose(f);
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(out);
    free(tokens);
    return 0;
}
