/*
 * gen-vision-driver: runs a text model + mmproj through llama.cpp's public
 * multimodal API (libmtmd over libllama) on the CPU, for one prompt holding
 * one image, and records what onebit's vision fixtures compare against.
 * Built and called by scripts/gen-vision-fixtures.py; see
 * testdata/llamacpp/README.md ("Vision towers").
 *
 *   gen-vision-driver TEXT.gguf MMPROJ.gguf IMAGE.rgb WIDTH HEIGHT PROMPT OUT_PREFIX
 *
 * IMAGE.rgb: one or more images of WIDTH x HEIGHT pixels, 8-bit RGB,
 * row-major, no header, one after another, each given to mtmd_bitmap_init
 * as it is (at the encoder's own size, so mtmd's resize is a copy). PROMPT
 * holds mtmd's default media marker once per image.
 * mtmd_tokenize (add_special, parse_special) splits it into chunks; then,
 * n_past from 0, seq 0:
 *   text chunk:  one llama_decode call with its tokens, logits for every one
 *                (appended to OUT_PREFIX.logits.bin, [n][n_vocab] f32);
 *   image chunk: mtmd_encode_chunk, its embeddings appended to
 *                OUT_PREFIX.embd.bin ([n_tokens][n_embd] f32), then
 *                mtmd_helper_decode_image_chunk (which switches causal
 *                attention off for gemma3, as llama-mtmd-cli does).
 * stdout: the chunks as JSON ({"chunks": [{"type": "text", "tokens": [...]},
 * {"type": "image", "n_tokens": N, "n_pos": P}, ...], "non_causal": B}).
 * Always: n_ctx = n_batch = n_ubatch = 128, 2 threads, KV cache F32, flash
 * attention off (text model and vision tower), no warmup.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "mtmd.h"
#include "mtmd-helper.h"

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

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: %s TEXT.gguf MMPROJ.gguf IMAGE.rgb WIDTH HEIGHT PROMPT OUT_PREFIX\n", argv[0]);
        return 2;
    }
    const char *text_path = argv[1], *mmproj = argv[2], *image = argv[3], *prompt = argv[6], *out = argv[7];
    int w = atoi(argv[4]), h = atoi(argv[5]);
    if (w <= 0 || h <= 0) {
        return fail("WIDTH and HEIGHT must be positive");
    }
    llama_log_set(quiet, NULL);
    mtmd_log_set(quiet, NULL);
    mtmd_helper_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(text_path, mp);
    if (!model) {
        return fail("llama.cpp could not load the text model");
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 128;
    cp.n_batch = 128;
    cp.n_ubatch = 128;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.no_perf = true;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context *lctx = llama_init_from_model(model, cp);
    if (!lctx) {
        return fail("llama.cpp could not make a context");
    }
    struct mtmd_context_params mparams = mtmd_context_params_default();
    mparams.use_gpu = false;
    mparams.print_timings = false;
    mparams.n_threads = 2;
    mparams.warmup = false;
    mparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    mtmd_context *mctx = mtmd_init_from_file(mmproj, model, mparams);
    if (!mctx) {
        return fail("mtmd could not load the mmproj");
    }

    size_t n_bytes = (size_t)w * (size_t)h * 3;
    FILE *f = fopen(image, "rb");
    if (!f) {
        return fail("could not open the image file");
    }
    fseek(f, 0, SEEK_END);
    long total = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (total <= 0 || (size_t)total % n_bytes != 0 || (size_t)total / n_bytes > 8) {
        return fail("the image file is not 1 to 8 images of WIDTH x HEIGHT x 3 bytes");
    }
    size_t n_images = (size_t)total / n_bytes;
    unsigned char *rgb = malloc((size_t)total);
    if (!rgb || fread(rgb, 1, (size_t)total, f) != (size_t)total) {
        return fail("could not read the images");
    }
    fclose(f);
    mtmd_bitmap *bitmaps[8];
    for (size_t i = 0; i < n_images; i++) {
        bitmaps[i] = mtmd_bitmap_init((uint32_t)w, (uint32_t)h, rgb + i * n_bytes);
    }
    struct mtmd_input_text txt = {prompt, strlen(prompt), true, true};
    mtmd_input_chunks *chunks = mtmd_input_chunks_init();
    int32_t rc = mtmd_tokenize(mctx, chunks, &txt, (const mtmd_bitmap **)bitmaps, n_images);
    if (rc != 0) {
        fprintf(stderr, "error: mtmd_tokenize returned %d\n", rc);
        return 1;
    }

    char path[4096];
    snprintf(path, sizeof path, "%s.logits.bin", out);
    FILE *flog = fopen(path, "wb");
    snprintf(path, sizeof path, "%s.embd.bin", out);
    FILE *femb = fopen(path, "wb");
    if (!flog || !femb) {
        return fail("could not write the output files");
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    int n_embd = llama_model_n_embd_inp(model);
    llama_pos n_past = 0;
    int non_causal = 0;
    printf("{\"chunks\": [");
    size_t n_chunks = mtmd_input_chunks_size(chunks);
    for (size_t c = 0; c < n_chunks; c++) {
        const mtmd_input_chunk *chunk = mtmd_input_chunks_get(chunks, c);
        printf("%s", c ? ", " : "");
        if (mtmd_input_chunk_get_type(chunk) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
            size_t n = 0;
            const llama_token *toks = mtmd_input_chunk_get_tokens_text(chunk, &n);
            struct llama_batch b = llama_batch_init((int32_t)n, 0, 1);
            printf("{\"type\": \"text\", \"tokens\": [");
            for (size_t i = 0; i < n; i++) {
                b.token[i] = toks[i];
                b.pos[i] = n_past + (llama_pos)i;
                b.n_seq_id[i] = 1;
                b.seq_id[i][0] = 0;
                b.logits[i] = 1;
                printf("%s%d", i ? ", " : "", toks[i]);
            }
            printf("]}");
            b.n_tokens = (int32_t)n;
            if (llama_decode(lctx, b) != 0) {
                return fail("llama_decode failed on a text chunk");
            }
            for (size_t i = 0; i < n; i++) {
                const float *l = llama_get_logits_ith(lctx, (int32_t)i);
                if (!l || fwrite(l, sizeof(float), (size_t)n_vocab, flog) != (size_t)n_vocab) {
                    return fail("no logits, or could not write them");
                }
            }
            llama_batch_free(b);
            n_past += (llama_pos)n;
        } else {
            size_t n = mtmd_input_chunk_get_n_tokens(chunk);
            non_causal = mtmd_decode_use_non_causal(mctx, chunk);
            if (mtmd_encode_chunk(mctx, chunk) != 0) {
                return fail("mtmd_encode_chunk failed");
            }
            float *embd = mtmd_get_output_embd(mctx);
            if (fwrite(embd, sizeof(float), n * (size_t)n_embd, femb) != n * (size_t)n_embd) {
                return fail("could not write the embeddings");
            }
            llama_pos next = n_past;
            if (mtmd_helper_decode_image_chunk(mctx, lctx, chunk, embd, n_past, 0, 128, &next, NULL, NULL) != 0) {
                return fail("mtmd_helper_decode_image_chunk failed");
            }
            printf("{\"type\": \"image\", \"n_tokens\": %zu, \"n_pos\": %d}", n, (int)(next - n_past));
            n_past = next;
        }
    }
    printf("], \"non_causal\": %s, \"n_vocab\": %d, \"n_embd\": %d}\n", non_causal ? "true" : "false", n_vocab,
           n_embd);
    fclose(flog);
    fclose(femb);
    mtmd_input_chunks_free(chunks);
    for (size_t i = 0; i < n_images; i++) {
        mtmd_bitmap_free(bitmaps[i]);
    }
    free(rgb);
    mtmd_free(mctx);
    llama_free(lctx);
    llama_model_free(model);
    return 0;
}
