/**
 * @file gen_fixture.h
 * @brief The generation tests' fixture: a fresh random tiny checkpoint in a temporary directory.
 */
#ifndef GEN_FIXTURE_H
#define GEN_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

/**
 * Make a temporary directory @p root and write `synth-model --shape tiny` (4 layers, seed
 * @p seed) into `<root>/tiny` (@p model), plus fixtures/generate/tokenizer.json when
 * @p srcdir is not NULL.  Returns 0, or -1 after printing the problem (the directory is
 * removed again).
 */
int gen_fixture_make(uint64_t seed, const char *srcdir, char *root, size_t root_len, char *model, size_t model_len);

#endif /* GEN_FIXTURE_H */
