/**
 * @file test_moe_align.c
 * @brief Suite "moe_align": the oracle refuses weights that are not aligned for their dtype.
 *
 * Safetensors does not require a tensor to start at a multiple of its element size, and the
 * oracle reads weights in place through typed pointers.  A misaligned BF16 router weight, F32
 * bias or I64 hash table must therefore be refused with the tensor's name (an earlier version
 * read them through misaligned pointers, which UBSan reports), and the same bytes at an
 * aligned address must be accepted.
 */
#include <stdlib.h>
#include <string.h>

#include "mmoe_moe.h"
#include "mmoe_moe_synth.h"
#include "mmoe_test.h"

/** Copy @p t to offset 1 of a fresh buffer (misaligned for any dtype wider than a byte). */
static unsigned char *misaligned_copy(mmoe_tensor *t)
{
    unsigned char *buf = malloc(t->nbytes + 16);
    ck_assert_ptr_nonnull(buf);
    memcpy(buf + 1, t->data, t->nbytes);
    t->data = buf + 1;
    return buf;
}

/** Attach @p w to a fresh layer of @p desc; return the status and the message. */
static mmoe_status attach(const mmoe_moe_desc *desc, const mmoe_moe_weights *w, mmoe_error *err)
{
    mmoe_moe_layer *layer = NULL;
    ck_assert_int_eq(mmoe_moe_layer_create(desc, &layer, err), MMOE_OK);
    mmoe_status st = mmoe_moe_layer_set_weights(layer, w, err);
    mmoe_moe_layer_destroy(layer);
    return st;
}

/** Run one misalignment case: _i = 0 gate (BF16), 1 bias (F32), 2 tid2eid (I64/I32). */
START_TEST(misaligned_router_tensor_is_refused)
{
    uint64_t seed = mmoe_test_seed("moe_align");
    mmoe_moe_desc desc;
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_moe_desc_from_shape("tiny", 4, &desc, &err), MMOE_OK);
    desc.routing = _i == 2 ? MMOE_ROUTING_HASH : MMOE_ROUTING_BIASED;
    mmoe_moe_synth *s = NULL;
    ck_assert_msg(mmoe_moe_synth_create(&desc, seed, MMOE_SYNTH_NORMAL, &s, &err) == MMOE_OK, "%s", err.msg);
    mmoe_moe_weights w = *mmoe_moe_synth_weights(s);
    ck_assert_int_eq(attach(&desc, &w, &err), MMOE_OK); /* the aligned original is accepted */

    mmoe_tensor *t = _i == 0 ? &w.gate : _i == 1 ? &w.gate_bias : &w.tid2eid;
    const char *name = _i == 0 ? "ffn.gate.weight" : _i == 1 ? "ffn.gate.bias" : "ffn.gate.tid2eid";
    ck_assert_ptr_nonnull(t->data);
    unsigned char *buf = misaligned_copy(t);
    ck_assert_int_eq(attach(&desc, &w, &err), MMOE_EFORMAT);
    ck_assert_msg(strstr(err.msg, name) != NULL && strstr(err.msg, "not aligned") != NULL, "%s", err.msg);

    /* the same bytes, aligned again, are accepted: the refusal is about the address only */
    memmove(buf, buf + 1, t->nbytes);
    t->data = buf;
    ck_assert_msg(attach(&desc, &w, &err) == MMOE_OK, "%s", err.msg);
    free(buf);
    mmoe_moe_synth_destroy(s);
}
END_TEST

/** The suite. */
static Suite *moe_align_suite(void)
{
    Suite *s = suite_create("moe_align");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, misaligned_router_tensor_is_refused, 0, 3);
    suite_add_tcase(s, tc);
    return s;
}

/** Entry point. */
int main(void)
{
    return mmoe_test_run(moe_align_suite());
}
