/* tools/eval.c — `zeropp eval DIR`: the loss and perplexity of a
 * checkpoint on the held-out split of the data it was trained on (or its
 * training split), through the trainer's own evaluation, so a checkpoint
 * scored on the ranks that trained it gives the run's validation loss bit
 * for bit. (`zeropp eval --init-from MODEL.bin|HF_DIR`, an llm.c model file
 * or a Hugging Face folder on a token file, is tools/llmc.c's.) */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "comm/comm.h"
#include "core/error.h"
#include "train/trainer.h"

void zpp_cli_eval_usage(FILE *f) {
    fprintf(f,
            "usage: [mpirun -np N] zeropp eval DIR [--split val|train] [--batches K]\n"
            "                   [--data FILE] [--set KEY=VALUE] [--device cpu|gpu] [--json]\n"
            "  The loss and perplexity (exp of the loss) of the checkpoint in DIR (its\n"
            "  published one, or the step folder DIR) with the config it was saved with,\n"
            "  on the data it was trained on (--data FILE: another file):\n"
            "  --split val       the held-out split (the default): the last tenth of the\n"
            "                    file, never trained on; what the run's val loss scores\n"
            "  --split train     the training split (the first nine tenths), read in order\n"
            "  --batches K       micro-batches in all, over the ranks (default: the run's\n"
            "                    zeropp.eval_batches times its rank count, so the same ranks\n"
            "                    reproduce the run's last validation loss bit for bit)\n"
            "  --set KEY=VALUE   override a config key (repeatable; the model must stay)\n"
            "  --node-size S, --device cpu|gpu, --emulate-nodes   as for zeropp train\n"
            "  --json            one line {\"loss\", \"perplexity\", \"split\", ...}\n"
            "\n"
            "usage: zeropp eval --init-from FILE|DIR --data TOKENS --batch-size B --batches K\n"
            "                   [--seq-len T] [--device cpu|gpu] [--json]\n"
            "  The mean loss of the llm.c GPT-2 model FILE (T: its max_seq_len), or of the\n"
            "  Hugging Face folder DIR (Llama, Mistral or Qwen2, read as `zeropp train\n"
            "  --init-from DIR` reads it; T: --seq-len, default its max_position_embeddings),\n"
            "  over K batches of B sequences of T tokens, in fp32 (a folder on the GPU: bf16,\n"
            "  the CUDA Llama's). Batch i is tokens\n"
            "  [i*B*T, (i+1)*B*T) of TOKENS (an llm.c token file, or raw text: bytes), with\n"
            "  the targets one token later, as llm.c's DataLoader reads them from the start\n"
            "  (no split: all of TOKENS counts); TOKENS needs K*B*T + 1 tokens. --device gpu\n"
            "  runs the CUDA model on GPU 0. --json prints {\"loss\": ...}.\n");
}

typedef struct eval_args {
    const char *dir, *data, *split, *device;
    int batches, node_size, emulate_nodes, json;
    zpp_cli_list sets;
} eval_args;

/* Prints only on rank 0: every rank parses the same line. */
static int parse(int argc, char **argv, eval_args *a, int print) {
    memset(a, 0, sizeof *a);
    a->split = "val";
    a->device = "cpu";
    const zpp_cli_opt opts[] = {
        {"DIR", ZPP_CLI_POS, &a->dir, 0, 0},
        {"--split", ZPP_CLI_STR, &a->split, 0, 0},
        {"--batches", ZPP_CLI_INT, &a->batches, 1, INT_MAX},
        {"--data", ZPP_CLI_STR, &a->data, 0, 0},
        {"--set", ZPP_CLI_LIST, &a->sets, 0, 0},
        {"--device", ZPP_CLI_STR, &a->device, 0, 0},
        {"--node-size", ZPP_CLI_INT, &a->node_size, 1, INT_MAX},
        {"--emulate-nodes", ZPP_CLI_FLAG, &a->emulate_nodes, 0, 0},
        {"--json", ZPP_CLI_FLAG, &a->json, 0, 0},
    };
    int pr = zpp_cli_parse_opts("eval", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]),
                                print);
    if (pr > 0) {
        if (print) zpp_cli_eval_usage(stdout);
        return 1;
    }
    if (pr < 0) return -1;
    const char *why = NULL;
    if (!a->dir)
        why = "name a checkpoint folder (zeropp eval DIR), or an llm.c model file or a Hugging "
              "Face folder with --init-from";
    else if (strcmp(a->split, "val") && strcmp(a->split, "train"))
        why = "--split takes val (the held-out split) or train";
    else if (strcmp(a->device, "cpu") && strcmp(a->device, "gpu"))
        why = "--device takes cpu or gpu";
    if (why) {
        if (print) fprintf(stderr, "zeropp eval: %s\n", why);
        return -1;
    }
    return 0;
}

static int fail(const char *context, zpp_status st) {
    if (st == ZPP_ERR_TIMEOUT) { /* not agreed: this rank says so and ends the job */
        zpp_cli_fail(context, st);
        zpp_cli_abort(3);
    }
    if (zpp_comm_world_rank() == 0) zpp_cli_fail(context, st);
    return 1;
}

/* The result, rank 0: one JSON object (--json) or the lines for people. */
static void print_eval(const eval_args *a, zpp_trainer *t, const char *family, const char *data,
                       long long batches, int step, float loss) {
    const int world = zpp_comm_world_size(), train_split = !strcmp(a->split, "train");
    const zpp_trainer_info *in = zpp_trainer_info_get(t);
    const zpp_data_info *d = &in->data;
    const size_t begin = train_split ? 0 : d->n_train;
    const size_t end = train_split ? d->n_train : d->n_tokens;
    const size_t windows = train_split ? d->train_windows : d->val_windows;
    const long long seqs = batches * in->micro_batch;
    const double ppl = exp((double)loss);
    if (a->json) {
        printf(
            "{\"checkpoint\":\"%s\",\"step\":%d,\"split\":\"%s\",\"loss\":%.9g,"
            "\"perplexity\":%.9g,\"batches\":%lld,\"sequences\":%lld,\"tokens\":%lld,"
            "\"split_begin\":%zu,\"split_end\":%zu}\n",
            a->dir, step, a->split, (double)loss, ppl, batches, seqs, seqs * (long long)in->seq_len,
            begin, end);
    } else {
        const char *what = data ? data : "the built-in synthetic corpus";
        const char *unit = d->kind == ZPP_DATA_RAW_TEXT ? "bytes" : "tokens";
        printf("eval: checkpoint %s (step %d), %s %zu params, %d rank%s\n", a->dir, step, family,
               in->n_params, world, world == 1 ? "" : "s");
        const char *comm_note = zpp_trainer_comm_note(t);
        if (comm_note[0]) printf("note: %s\n", comm_note);
        printf("data: %s (%s, %zu %s); %s: %s %s [%zu, %zu)\n", what, zpp_data_kind_name(d->kind),
               d->n_tokens, unit,
               train_split ? "the training split (--split train)"
                           : "the held-out split (--split val), never trained on",
               train_split ? "all but the last tenth," : "the last tenth,", unit, begin, end);
        printf("read %lld batch%s of %d sequences of %d tokens: %lld tokens", batches,
               batches == 1 ? "" : "es", in->micro_batch, in->seq_len,
               seqs * (long long)in->seq_len);
        if ((unsigned long long)seqs > windows)
            printf(" (the split holds %zu sequences: the batches past them repeat them)", windows);
        printf("\nloss %.6f | perplexity %.4f\n", (double)loss, ppl);
    }
}

int zpp_cli_eval_checkpoint(int argc, char **argv) {
    const int rank = zpp_comm_world_rank(), world = zpp_comm_world_size();
    eval_args a;
    int pr = parse(argc, argv, &a, rank == 0);
    if (pr) return pr > 0 ? 0 : 2;

    zpp_train_config cfg;
    zpp_trainer_saved_run saved;
    memset(&saved, 0, sizeof saved);
    const char *stage = "eval";
    zpp_status st = zpp_trainer_config_from_checkpoint(a.dir, &cfg, &saved);
    if (st == ZPP_OK && a.sets.n) {
        stage = "--set";
        st = zpp_train_config_set(&cfg, a.sets.v, a.sets.n);
    }
    const char *data = a.data ? a.data : saved.data_path;
    if (st == ZPP_OK && !a.data && data && access(data, R_OK) != 0)
        st = zpp_error(ZPP_ERR_IO,
                       "checkpoint %s was trained on %s, which cannot be read (%s); pass --data "
                       "FILE to score it on another file",
                       a.dir, data, strerror(errno));
    st = zpp_comm_agree_world(st);
    if (st != ZPP_OK) {
        free(saved.data_path);
        free(saved.init_from);
        return fail(stage, st);
    }
    /* The run scored eval_batches micro-batches a rank on its own ranks: as
     * many in all here, spread over these ranks (rounded up to a whole
     * number a rank). */
    const int train_split = !strcmp(a.split, "train");
    long long total = a.batches ? a.batches : (long long)cfg.eval_batches * saved.world_size;
    const int per_rank = (int)((total + world - 1) / world);
    zpp_trainer *t = NULL;
    zpp_trainer_opts to = {data, a.node_size, !strcmp(a.device, "gpu"), a.emulate_nodes, 0,
                           NULL, NULL};
    int step = 0;
    float loss = 0.0f;
    ZPP_CHECK_GOTO(zpp_trainer_create(&cfg, &to, &t), st, out);
    ZPP_CHECK_GOTO(zpp_trainer_load(t, a.dir, &step), st, out);
    ZPP_CHECK_GOTO(zpp_trainer_evaluate(t, train_split, per_rank, &loss, NULL), st, out);
    if (rank == 0)
        print_eval(&a, t, cfg.model_family == ZPP_FAMILY_LLAMA ? "Llama" : "GPT-2", data,
                   (long long)per_rank * world, step, loss);
out:
    zpp_trainer_destroy(t);
    free(saved.data_path);
    free(saved.init_from);
    return st == ZPP_OK ? 0 : fail("eval", st);
}
