/* tools/llmc.c — `zeropp export` (a checkpoint to an llm.c model file) and
 * `zeropp eval` (the mean loss of an llm.c model file on a token file).
 * Both run in one process, without MPI (train/llmc.h has the formats). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core/error.h"
#include "device/device.h"
#include "model/gpt2.h"
#include "train/checkpoint.h"
#include "train/llmc.h"

static void export_usage(FILE *f) {
    fprintf(f,
            "usage: zeropp export --from DIR --to FILE [--dtype fp32|bf16]\n"
            "  Writes the fp32 master weights of the checkpoint in DIR (its published one, or\n"
            "  the step folder DIR) as an llm.c GPT-2 model file: version 3 with fp32\n"
            "  parameters (the default), or version 5 with bf16 (rounded to nearest even).\n"
            "  A checkpoint of `zeropp train --init-from F --steps 0 --save DIR` exports F\n"
            "  back byte for byte (a bf16 F with --dtype bf16). FILE is written whole or not\n"
            "  at all (through FILE.tmp and a rename).\n");
}

int zpp_cli_export(int argc, char **argv) {
    const char *from = NULL, *to = NULL, *dtype = "fp32";
    const zpp_cli_opt opts[] = {
        {"--from", ZPP_CLI_STR, &from, 0, 0},
        {"--to", ZPP_CLI_STR, &to, 0, 0},
        {"--dtype", ZPP_CLI_STR, &dtype, 0, 0},
    };
    int pr = zpp_cli_parse_opts("export", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), 1);
    if (pr > 0) {
        export_usage(stdout);
        return 0;
    }
    if (pr < 0) return 2;
    if (!from || !to) {
        fprintf(stderr, "zeropp export: needs --from DIR and --to FILE\n");
        return 2;
    }
    if (strcmp(dtype, "fp32") && strcmp(dtype, "bf16")) {
        fprintf(stderr, "zeropp export: --dtype takes fp32 or bf16, not '%s'\n", dtype);
        return 2;
    }
    zpp_ckpt_manifest m;
    float **units = NULL;
    zpp_status st = zpp_checkpoint_read_masters(from, &m, &units);
    if (st != ZPP_OK) return zpp_cli_fail("export", st);
    /* the manifest's shape must be the units it lists */
    st = zpp_gpt2_config_check(&m.model);
    if (st == ZPP_OK && m.n_units != m.model.n_layer + 1)
        st = zpp_error(ZPP_ERR_FORMAT, "checkpoint %s has %d units; its model has %d layers",
                       from, m.n_units, m.model.n_layer);
    for (int u = 0; st == ZPP_OK && u < m.n_units; u++)
        if (m.numel[u] != zpp_gpt2_unit_numel(&m.model, u))
            st = zpp_error(ZPP_ERR_FORMAT,
                           "checkpoint %s: unit %d has %zu parameters; its model's has %zu", from,
                           u, m.numel[u], zpp_gpt2_unit_numel(&m.model, u));
    const zpp_dtype dt = strcmp(dtype, "bf16") ? ZPP_FP32 : ZPP_BF16;
    if (st == ZPP_OK) st = zpp_llmc_write(to, &m.model, dt, (const float *const *)units);
    if (st == ZPP_OK)
        printf("wrote %s: llm.c GPT-2 (version %d, %s), %d layers, %d heads, %d channels, "
               "max T %d, vocabulary %d padded to %d, from step %d of %s\n",
               to, dt == ZPP_FP32 ? ZPP_LLMC_VERSION_FP32 : ZPP_LLMC_VERSION_BF16, dtype,
               m.model.n_layer, m.model.n_head, m.model.n_embd, m.model.seq_len,
               zpp_gpt2_real_vocab(&m.model), m.model.vocab_size, m.step, from);
    for (int u = 0; u < m.n_units; u++) free(units[u]);
    free(units);
    zpp_ckpt_manifest_free(&m);
    return st == ZPP_OK ? 0 : zpp_cli_fail("export", st);
}

int zpp_cli_eval(int argc, char **argv) {
    const char *model = NULL, *data = NULL, *device = "cpu";
    int batch = 0, batches = 0, json = 0;
    const zpp_cli_opt opts[] = {
        {"--init-from", ZPP_CLI_STR, &model, 0, 0},
        {"--data", ZPP_CLI_STR, &data, 0, 0},
        {"--batch-size", ZPP_CLI_INT, &batch, 1, INT_MAX},
        {"--batches", ZPP_CLI_INT, &batches, 1, INT_MAX},
        {"--device", ZPP_CLI_STR, &device, 0, 0},
        {"--json", ZPP_CLI_FLAG, &json, 0, 0},
    };
    int pr = zpp_cli_parse_opts("eval", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), 1);
    if (pr > 0) {
        zpp_cli_eval_usage(stdout);
        return 0;
    }
    if (pr < 0) return 2;
    if (!model || !data || batch < 1 || batches < 1) {
        fprintf(stderr, "zeropp eval: needs --init-from FILE, --data TOKENS, --batch-size B and "
                        "--batches K\n");
        return 2;
    }
    if (strcmp(device, "cpu") && strcmp(device, "gpu")) {
        fprintf(stderr, "zeropp eval: --device takes cpu or gpu, not '%s'\n", device);
        return 2;
    }
    zpp_device *dev = NULL;
    zpp_status st = strcmp(device, "gpu") ? zpp_device_create_host(&dev)
                                          : zpp_device_create_gpu(0, &dev);
    if (st != ZPP_OK) return zpp_cli_fail("eval", st);
    zpp_llmc_eval_opts eo = {batch, batches};
    double loss = 0.0;
    st = zpp_llmc_eval(model, data, &eo, dev, &loss);
    zpp_device_destroy(dev);
    if (st != ZPP_OK) return zpp_cli_fail("eval", st);
    if (json)
        printf("{\"loss\": %.9g, \"batches\": %d, \"batch_size\": %d}\n", loss, batches, batch);
    else
        printf("loss %.6f (mean of %d batches of %d sequences, read from the start of %s: for a "
               "file zeropp trained on, that is its training split; `zeropp eval DIR` scores a "
               "checkpoint on the held-out split)\n",
               loss, batches, batch, data);
    return 0;
}
