/*
 * tokenize-driver: tokenizes texts with llama.cpp's public API (libllama),
 * the llama_tokenize call llama-tokenize makes, on a vocabulary-only load.
 * Built and called by scripts/gen-o200k-harmony.py.
 *
 *   tokenize-driver MODEL.gguf TEXTS
 *
 * TEXTS holds the texts, each ended by a NUL byte. For each text one line
 * goes to stdout: its ids separated by spaces, tokenized as llama-tokenize
 * does by default (the model's BOS/EOS rule, special tokens parsed).
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

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL.gguf TEXTS\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "error: llama.cpp could not load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);

    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        fprintf(stderr, "error: could not read %s\n", argv[2]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)size + 1);
    if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "error: could not read %s\n", argv[2]);
        return 1;
    }
    fclose(f);
    buf[size] = 0;

    long at = 0;
    while (at < size) {
        const char *text = buf + at;
        int len = (int)strlen(text);
        int cap = len + 8;
        llama_token *ids = malloc(sizeof(llama_token) * (size_t)cap);
        int n = llama_tokenize(vocab, text, len, ids, cap, true, true);
        if (n < 0) {
            fprintf(stderr, "error: llama_tokenize wants %d ids\n", -n);
            return 1;
        }
        for (int i = 0; i < n; i++) {
            printf(i ? " %d" : "%d", ids[i]);
        }
        printf("\n");
        free(ids);
        at += len + 1;
    }
    free(buf);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
