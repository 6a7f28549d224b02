/*
 * vision-bench: times llama.cpp's vision encoder (libmtmd's
 * mtmd_encode_chunk) on one mmproj, as `onebit bench --mmproj` times
 * onebit's. Built and run by scripts/bench-vision.sh against the build of
 * scripts/build-llamacpp.sh; the image-side counterpart of llama-bench.
 *
 *   vision-bench TEXT.gguf MMPROJ.gguf THREADS REPETITIONS
 *
 * TEXT.gguf: any text model whose width is the projector's output width
 * (mtmd needs one; only its vocabulary and width are used). One synthetic
 * image (a fixed LCG's RGB bytes) at the tower's own size (mtmd_tokenize's
 * preprocessing, which sizes it to the encoder, is untimed) is tokenized
 * once; its image chunk is encoded once untimed (warm-up: graph allocation,
 * first touch of the weights) and then REPETITIONS times, each timed alone.
 * mtmd's context parameters are its defaults (flash attention as mtmd
 * chooses it) except: CPU only, THREADS threads, no timings print, no
 * warm-up at init (ours is the untimed encode).
 * stdout: one JSON object: {"n_tokens": N, "threads": T, "ms": [...], "ms_median": M,
 * "images_per_s": R}.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama.h"
#include "mtmd.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static int fail(const char *what) {
    fprintf(stderr, "error: %s\n", what);
    return 1;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s TEXT.gguf MMPROJ.gguf THREADS REPETITIONS\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[3]), reps = atoi(argv[4]);
    if (threads <= 0 || reps <= 0 || reps > 1000) {
        return fail("THREADS must be positive and REPETITIONS 1 to 1000");
    }
    llama_log_set(quiet, NULL);
    mtmd_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        return fail("llama.cpp could not load the text model");
    }
    struct mtmd_context_params p = mtmd_context_params_default();
    p.use_gpu = false;
    p.print_timings = false;
    p.n_threads = threads;
    p.warmup = false;
    mtmd_context *ctx = mtmd_init_from_file(argv[2], model, p);
    if (!ctx) {
        return fail("mtmd could not load the mmproj");
    }
    /* 896 x 896 is SigLIP's size; mtmd resizes any other to the tower's
       own size in mtmd_tokenize, outside the timed part. */
    const uint32_t side = 896;
    size_t n = (size_t)side * side * 3;
    unsigned char *rgb = malloc(n);
    if (!rgb) {
        return fail("out of memory");
    }
    uint64_t x = 0x2545F4914F6CDD1DULL;
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        rgb[i] = (unsigned char)(x >> 56);
    }
    mtmd_bitmap *bmp = mtmd_bitmap_init(side, side, rgb);
    struct mtmd_input_text txt = {mtmd_default_marker(), strlen(mtmd_default_marker()), false, true};
    mtmd_input_chunks *chunks = mtmd_input_chunks_init();
    if (mtmd_tokenize(ctx, chunks, &txt, (const mtmd_bitmap **)&bmp, 1) != 0) {
        return fail("mtmd_tokenize failed");
    }
    const mtmd_input_chunk *image = NULL;
    for (size_t c = 0; c < mtmd_input_chunks_size(chunks); c++) {
        const mtmd_input_chunk *chunk = mtmd_input_chunks_get(chunks, c);
        if (mtmd_input_chunk_get_type(chunk) == MTMD_INPUT_CHUNK_TYPE_IMAGE) {
            image = chunk;
        }
    }
    if (!image) {
        return fail("no image chunk");
    }
    if (mtmd_encode_chunk(ctx, image) != 0) {
        return fail("mtmd_encode_chunk failed (warm-up)");
    }
    double *ms = malloc(sizeof(double) * (size_t)reps);
    for (int r = 0; r < reps; r++) {
        double t0 = now_ms();
        if (mtmd_encode_chunk(ctx, image) != 0) {
            return fail("mtmd_encode_chunk failed");
        }
        ms[r] = now_ms() - t0;
    }
    printf("{\"n_tokens\": %zu, \"threads\": %d, \"ms\": [", mtmd_input_chunk_get_n_tokens(image), threads);
    for (int r = 0; r < reps; r++) {
        printf("%s%.1f", r ? ", " : "", ms[r]);
    }
    qsort(ms, (size_t)reps, sizeof(double), by_value);
    double med = ms[reps / 2];
    printf("], \"ms_median\": %.1f, \"images_per_s\": %.4f}\n", med, 1e3 / med);
    free(ms);
    mtmd_input_chunks_free(chunks);
    mtmd_bitmap_free(bmp);
    free(rgb);
    mtmd_free(ctx);
    llama_model_free(model);
    return 0;
}
