/**
 * @file moe_layer.c
 * @brief The C API example of the README: one MoE layer of a checkpoint on the CPU oracle.
 *
 *     moe_layer SHAPE WEIGHTS LAYER INPUT OUTPUT
 *
 * SHAPE names the layer's sizes and values (mmoe_moe_desc_from_shape(): "v4-flash", "tiny",
 * ...), WEIGHTS is a safetensors file or checkpoint directory holding `layers.LAYER.ffn.*`,
 * INPUT a safetensors file with `x` BF16 [T, D] (and `token_ids` for a hash layer), OUTPUT
 * receives `y` BF16 [T, D].  It uses only the installed headers and the library:
 *
 *     cc moe_layer.c $(pkg-config --cflags --libs --static megamoe)
 *
 * `make check` builds it against the public headers alone and compares its `y` with
 * `megamoe moe`'s bit for bit; `make installcheck` builds it with the line above.
 */
#include <stdio.h>
#include <stdlib.h>

#include <megamoe/mmoe_moe.h>
#include <megamoe/mmoe_safetensors.h>

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: moe_layer SHAPE WEIGHTS LAYER INPUT OUTPUT\n");
        return 2;
    }
    const int layer_index = atoi(argv[3]);
    mmoe_error err;
    mmoe_ckpt *ckpt = NULL;
    mmoe_st_file *input = NULL;
    mmoe_moe_layer *layer = NULL;
    mmoe_st_writer *w = NULL;
    uint16_t *y = NULL;
    mmoe_moe_desc desc;
    int rc = 1;

    /* the layer: sizes from the shape's name, weights through the checkpoint's lookup */
    if (mmoe_ckpt_open(argv[2], &ckpt, &err) != MMOE_OK ||
        mmoe_moe_desc_from_shape(argv[1], 0, &desc, &err) != MMOE_OK)
        goto fail;
    desc.recipe = MMOE_RECIPE_SM100; /* or _SM90, _DSV4_REF */
    if (mmoe_moe_layer_create(&desc, &layer, &err) != MMOE_OK ||
        mmoe_moe_layer_load(layer, mmoe_ckpt_lookup, ckpt, layer_index, &err) != MMOE_OK)
        goto fail;

    /* the input: x [T, D] (and token_ids [T] for a hash layer) */
    if (mmoe_st_open(argv[4], &input, &err) != MMOE_OK)
        goto fail;
    const mmoe_tensor *x = mmoe_st_find(input, "x"), *ids = mmoe_st_find(input, "token_ids");
    if (x == NULL || x->dtype != MMOE_DT_BF16 || x->ndim != 2 || x->shape[1] != desc.hidden) {
        fprintf(stderr, "%s: expected a tensor 'x' BF16 [T, %lld]\n", argv[4], (long long)desc.hidden);
        goto done;
    }
    const int64_t t = x->shape[0];
    y = malloc((size_t)(t * desc.hidden > 0 ? t * desc.hidden : 1) * sizeof *y);
    if (y == NULL) {
        fprintf(stderr, "out of memory\n");
        goto done;
    }
    mmoe_moe_input in = {t, x->data, NULL, NULL, NULL};
    if (desc.routing == MMOE_ROUTING_HASH && ids != NULL && ids->dtype == MMOE_DT_I32)
        in.token_ids = ids->data;
    mmoe_moe_output out = {y, NULL, NULL};
    mmoe_moe_result res;
    mmoe_moe_result_init(&res); /* res: the shared expert's path and why, counters, timings */
    if (mmoe_moe_layer_run(layer, &in, &out, &res, &err) != MMOE_OK)
        goto fail;
    printf("%lld tokens, shared path %s, %.3f ms\n", (long long)t, mmoe_moe_path_name(res.shared_path),
           1e3 * res.time.total_s);

    /* the output: y [T, D], written atomically */
    const int64_t shape[2] = {t, desc.hidden};
    if (mmoe_st_writer_create(&w, &err) != MMOE_OK ||
        mmoe_st_writer_add(w, "y", MMOE_DT_BF16, 2, shape, y, (size_t)(t * desc.hidden) * sizeof *y, &err) != MMOE_OK ||
        mmoe_st_writer_finish(w, argv[5], &err) != MMOE_OK)
        goto fail;
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "moe_layer: %s\n", err.msg);
done:
    mmoe_st_writer_destroy(w);
    free(y);
    mmoe_st_close(input);
    mmoe_moe_layer_destroy(layer);
    mmoe_ckpt_close(ckpt);
    return rc;
}
