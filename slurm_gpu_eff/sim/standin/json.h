/* A small JSON reader for the stand-in NVML: the devices file and the workload state
 * files. It builds a tree of malloc'd nodes, with bounded nesting and node counts, so a
 * hostile or truncated file costs an error, never a crash. */
#ifndef STANDIN_JSON_H
#define STANDIN_JSON_H

#include <stdbool.h>
#include <stddef.h>

enum json_type { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT };

struct json {
    enum json_type type;
    bool boolean;        /* JSON_BOOL */
    double number;       /* JSON_NUMBER (always finite) */
    char *string;        /* JSON_STRING: NUL-terminated UTF-8 (no embedded NUL) */
    size_t count;        /* JSON_ARRAY / JSON_OBJECT: number of items */
    struct json *items;  /* JSON_ARRAY / JSON_OBJECT: the values */
    char **keys;         /* JSON_OBJECT: the keys, parallel to items */
};

/* The parsed document, or NULL when the text is not one valid JSON value (or exceeds the
 * limits). Free with json_free. */
struct json *json_parse(const char *text, size_t length);
void json_free(struct json *value);

/* The value under `key` in an object (the last one when a key repeats, as Python's json
 * does), or NULL (also when `object` is not an object). */
const struct json *json_get(const struct json *object, const char *key);

/* Reads a whole file of at most `max_bytes`: a malloc'd, NUL-terminated buffer, or NULL. */
char *read_text_file(const char *path, size_t max_bytes, size_t *length);

#endif
