/**
 * @file st_test_files.h
 * @brief Whole-file read and write helpers shared by the safetensors suites.
 *
 * Test setup, not library code: they abort the running Check test on failure.
 */
#ifndef ST_TEST_FILES_H
#define ST_TEST_FILES_H

#include <stddef.h>
#include <stdint.h>

/** Read all of @p path into a malloc'd, NUL-terminated buffer; its length goes to *n. */
uint8_t *st_test_slurp(const char *path, size_t *n);

/** Write @p n bytes at @p p to @p path (created or truncated). */
void st_test_spill(const char *path, const void *p, size_t n);

#endif /* ST_TEST_FILES_H */
