/**
 * @file gen_fixture.c
 * @brief The generation tests' fixture (see gen_fixture.h).
 */
#include <stdio.h>

#include "gen_fixture.h"
#include "mmoe_config.h"
#include "mmoe_synth_model.h"
#include "mmoe_test.h"

int gen_fixture_make(uint64_t seed, const char *srcdir, char *root, size_t root_len, char *model, size_t model_len)
{
    if (mmoe_test_mkdtemp(root, root_len) != 0) {
        fprintf(stderr, "fixture: cannot make a temporary directory\n");
        return -1;
    }
    snprintf(model, model_len, "%s/tiny", root);
    mmoe_config cfg;
    mmoe_error err = {0};
    if (mmoe_config_preset("tiny", 4, &cfg, &err) != MMOE_OK ||
        mmoe_synth_model_write(&cfg, seed, model, 0, 0, NULL, NULL, &err) != MMOE_OK) {
        fprintf(stderr, "fixture: %s\n", err.msg);
        mmoe_test_rmtree(root);
        return -1;
    }
    if (srcdir != NULL) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "cp '%s/fixtures/generate/tokenizer.json' '%s/'", srcdir, model);
        if (mmoe_test_system(cmd) != 0) {
            fprintf(stderr, "fixture: cannot copy the tokenizer: %s\n", cmd);
            mmoe_test_rmtree(root);
            return -1;
        }
    }
    return 0;
}
