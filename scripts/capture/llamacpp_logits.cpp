// llama.cpp's greedy ids and top logits for prompts of ids, as JSON on stdout.
// Usage: llamacpp_logits MODEL.gguf STEPS TOP_K IDS[,IDS...] [IDS ...]   (one argument a prompt)
// Built by scripts/capture/llamacpp_oracle.py against a llama.cpp build (CPU, float32 KV cache,
// so that the only differences left against macspec are float32 rounding).
#include "llama.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

static void quiet(enum ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static std::vector<llama_token> parse_ids(const std::string & text) {
    std::vector<llama_token> ids;
    std::stringstream stream(text);
    std::string item;
    while (std::getline(stream, item, ',')) {
        ids.push_back(std::stoi(item));
    }
    return ids;
}

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL STEPS TOP_K IDS[,IDS...] ...\n", argv[0]);
        return 2;
    }
    const int steps = std::atoi(argv[2]);
    const int top_k = std::atoi(argv[3]);
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params model_params = llama_model_default_params();
    model_params.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], model_params);
    if (model == nullptr) {
        fprintf(stderr, "llama.cpp could not load %s\n", argv[1]);
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    printf("[");
    for (int p = 4; p < argc; ++p) {
        std::vector<llama_token> prompt = parse_ids(argv[p]);
        llama_context_params ctx_params = llama_context_default_params();
        ctx_params.n_ctx = 512;
        ctx_params.n_batch = 512;
        ctx_params.n_ubatch = 512;
        ctx_params.n_threads = 2;
        ctx_params.n_threads_batch = 2;
        ctx_params.type_k = GGML_TYPE_F32;
        ctx_params.type_v = GGML_TYPE_F32;
        ctx_params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        llama_context * ctx = llama_init_from_model(model, ctx_params);
        if (ctx == nullptr) {
            fprintf(stderr, "llama.cpp could not make a context\n");
            return 1;
        }
        printf("%s{\"prompt\": [", p > 4 ? ", " : "");
        for (size_t i = 0; i < prompt.size(); ++i) {
            printf("%s%d", i ? ", " : "", prompt[i]);
        }
        printf("], \"steps\": [");
        std::vector<llama_token> batch_ids = prompt;
        for (int step = 0; step < steps; ++step) {
            if (llama_decode(ctx, llama_batch_get_one(batch_ids.data(), (int32_t) batch_ids.size()))) {
                fprintf(stderr, "llama_decode failed\n");
                return 1;
            }
            const float * logits = llama_get_logits_ith(ctx, -1);
            std::vector<int> order(n_vocab);
            for (int i = 0; i < n_vocab; ++i) {
                order[i] = i;
            }
            std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                              [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
            printf("%s{\"id\": %d, \"top\": [", step ? ", " : "", order[0]);
            for (int i = 0; i < top_k; ++i) {
                printf("%s[%d, %.6f]", i ? ", " : "", order[i], logits[order[i]]);
            }
            printf("]}");
            batch_ids.assign(1, order[0]);
        }
        printf("]}");
        llama_free(ctx);
    }
    printf("]\n");
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
