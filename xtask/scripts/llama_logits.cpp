// Reference logits from llama.cpp's own reader and graph (libllama, built from the pinned
// llama-cpp-python sdist), for the MoE GGUF fixtures (`xtask/src/moe_gguf.rs`).
//
//   llama_logits MODEL.gguf OUT.f32 N_GEN TOKEN...
//
// Decodes the prompt TOKEN... in one batch with every position's logits kept (all in f32: the
// KV cache too, flash attention off, so the figures are llama.cpp's graph without its f16
// storage), writes them to OUT.f32 (n_tokens x n_vocab little-endian f32, row per position),
// then decodes N_GEN greedy tokens one at a time and prints them on stdout, space-separated.
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

static void quiet(enum ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static int argmax(const float * row, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (row[i] > row[best]) {
            best = i;
        }
    }
    return best;
}

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL.gguf OUT.f32 N_GEN TOKEN...\n", argv[0]);
        return 2;
    }
    const int n_gen = atoi(argv[3]);
    std::vector<llama_token> prompt;
    for (int i = 4; i < argc; i++) {
        prompt.push_back((llama_token) atoi(argv[i]));
    }
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot make a context\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    const int n = (int) prompt.size();
    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i] = prompt[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "llama_decode failed on the prompt\n");
        return 1;
    }
    FILE * out = fopen(argv[2], "wb");
    if (!out) {
        fprintf(stderr, "cannot write %s\n", argv[2]);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        fwrite(llama_get_logits_ith(ctx, i), sizeof(float), n_vocab, out);
    }
    fclose(out);
    int next = argmax(llama_get_logits_ith(ctx, n - 1), n_vocab);
    for (int g = 0; g < n_gen; g++) {
        printf(g ? " %d" : "%d", next);
        batch.n_tokens = 1;
        batch.token[0] = next;
        batch.pos[0] = n + g;
        batch.logits[0] = 1;
        if (g + 1 == n_gen) {
            break;
        }
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "llama_decode failed at step %d\n", g);
            return 1;
        }
        next = argmax(llama_get_logits_ith(ctx, 0), n_vocab);
    }
    printf("\n");
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
