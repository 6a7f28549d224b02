/* A small timer over a llama.cpp-style C API (llama.h), for engines that
 * ship the library but no llama-bench: ik_llama.cpp's PyPI wheel
 * (ik-llama-cpp-python 0.1.5), built by scripts/build-ikllama.sh.
 *
 *   ik-bench MODEL.gguf THREADS PP TG REPS REPACK
 *
 * Measures as llama-bench does: ppPP is one llama_decode of PP random token
 * ids at positions 0.., on an empty cache; tgTG is TG single-token decodes
 * from an empty cache, one token after another. Each test runs once as a
 * warm-up, then REPS times, the cache cleared before each. REPACK 1 sets
 * the model parameter repack_tensors (ik_llama.cpp's run-time repacking of
 * the weights into its interleaved layouts), 0 leaves the file's layout.
 * Prints one JSON line: {"pp": [tok/s per rep], "tg": [...], "repack": 0|1}.
 * The token ids are drawn from a fixed seed (1234) over the whole
 * vocabulary; speed does not depend on which ids they are. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static unsigned long long rng_state = 1234;
static unsigned int rnd(void) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (unsigned int)(rng_state >> 33);
}

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static int decode_or_die(struct llama_context *ctx, llama_token *toks, int n, int pos) {
    struct llama_batch b = llama_batch_get_one(toks, n, pos, 0);
    if (llama_decode(ctx, b) != 0) {
        fprintf(stderr, "ik-bench: llama_decode of %d tokens at %d failed\n", n, pos);
        exit(1);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s MODEL.gguf THREADS PP TG REPS REPACK\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    int threads = atoi(argv[2]), pp = atoi(argv[3]), tg = atoi(argv[4]);
    int reps = atoi(argv[5]), repack = atoi(argv[6]);
    if (threads < 1 || pp < 0 || tg < 0 || reps < 1 || (pp == 0 && tg == 0)) {
        fprintf(stderr, "ik-bench: THREADS and REPS must be >= 1, PP and TG >= 0 and not both 0\n");
        return 2;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.repack_tensors = repack != 0;
    struct llama_model *model = llama_model_load_from_file(path, mp);
    if (!model) {
        fprintf(stderr, "ik-bench: cannot load %s\n", path);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    int longest = pp > tg ? pp : tg;
    cp.n_ctx = (uint32_t)(longest + 16);
    cp.n_batch = (uint32_t)(pp > 0 ? pp : 1);
    cp.n_ubatch = (uint32_t)(pp > 0 && pp < 512 ? pp : 512);
    cp.n_threads = (uint32_t)threads;
    cp.n_threads_batch = (uint32_t)threads;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "ik-bench: cannot make a context for %s\n", path);
        return 1;
    }
    int n_vocab = llama_n_vocab(model);
    llama_token *toks = malloc(sizeof(llama_token) * (size_t)(longest > 0 ? longest : 1));
    for (int i = 0; i < longest; i++) toks[i] = (llama_token)(rnd() % (unsigned)n_vocab);

    printf("{\"repack\": %d, \"pp\": [", repack != 0);
    if (pp > 0) {
        for (int r = -1; r < reps; r++) {
            llama_kv_cache_clear(ctx);
            int64_t t0 = llama_time_us();
            decode_or_die(ctx, toks, pp, 0);
            llama_synchronize(ctx);
            double s = (double)(llama_time_us() - t0) / 1e6;
            if (r >= 0) printf("%s%.3f", r ? ", " : "", pp / s);
        }
    }
    printf("], \"tg\": [");
    if (tg > 0) {
        for (int r = -1; r < reps; r++) {
            llama_kv_cache_clear(ctx);
            int64_t t0 = llama_time_us();
            for (int i = 0; i < tg; i++) decode_or_die(ctx, &toks[i], 1, i);
            llama_synchronize(ctx);
            double s = (double)(llama_time_us() - t0) / 1e6;
            if (r >= 0) printf("%s%.3f", r ? ", " : "", tg / s);
        }
    }
    printf("]}\n");
    free(toks);
    llama_free(ctx);
    llama_free_model(model);
    llama_backend_free();
    return 0;
}
