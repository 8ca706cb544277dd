/* A small, bounded JSON reader (RFC 8259; no NaN/Infinity extensions). */
#define _GNU_SOURCE
#include "json.h"

#include <errno.h>
#include <fcntl.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Limits: deep enough for any file we read, small enough that recursion is safe. */
#define MAX_DEPTH 64
#define MAX_NODES (1u << 20)

struct parser {
    const char *at;
    const char *end;
    size_t nodes;
};

static bool parse_value(struct parser *p, struct json *out, int depth);

/* Numbers are read in the C locale whatever the process's locale is (a host program
 * may have called setlocale). */
static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;

static void make_c_locale(void)
{
    c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
}

static void skip_space(struct parser *p)
{
    while (p->at < p->end && (*p->at == ' ' || *p->at == '\t' || *p->at == '\n' || *p->at == '\r'))
        p->at++;
}

static bool literal(struct parser *p, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(p->end - p->at) < n || memcmp(p->at, word, n) != 0)
        return false;
    p->at += n;
    return true;
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Checks the JSON number grammar, then converts the span with strtod in the C locale. */
static bool parse_number(struct parser *p, struct json *out)
{
    const char *start = p->at, *s = p->at;
    if (s < p->end && *s == '-')
        s++;
    if (s >= p->end || !is_digit(*s))
        return false;
    if (*s == '0')
        s++;
    else
        while (s < p->end && is_digit(*s))
            s++;
    if (s < p->end && *s == '.') {
        s++;
        if (s >= p->end || !is_digit(*s))
            return false;
        while (s < p->end && is_digit(*s))
            s++;
    }
    if (s < p->end && (*s == 'e' || *s == 'E')) {
        s++;
        if (s < p->end && (*s == '+' || *s == '-'))
            s++;
        if (s >= p->end || !is_digit(*s))
            return false;
        while (s < p->end && is_digit(*s))
            s++;
    }
    size_t n = (size_t)(s - start);
    char buffer[64];
    if (n >= sizeof buffer)
        return false; /* no number in our files needs 63 characters */
    memcpy(buffer, start, n);
    buffer[n] = '\0';
    pthread_once(&c_locale_once, make_c_locale);
    if (c_locale == (locale_t)0)
        return false;
    double value = strtod_l(buffer, NULL, c_locale);
    if (!isfinite(value))
        return false;
    out->type = JSON_NUMBER;
    out->number = value;
    p->at = s;
    return true;
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static bool read_hex4(struct parser *p, unsigned *code)
{
    if (p->end - p->at < 4)
        return false;
    *code = 0;
    for (int i = 0; i < 4; i++) {
        int v = hex_value(p->at[i]);
        if (v < 0)
            return false;
        *code = *code * 16 + (unsigned)v;
    }
    p->at += 4;
    return true;
}

static size_t put_utf8(char *out, unsigned code)
{
    if (code < 0x80) {
        out[0] = (char)code;
        return 1;
    }
    if (code < 0x800) {
        out[0] = (char)(0xC0 | (code >> 6));
        out[1] = (char)(0x80 | (code & 0x3F));
        return 2;
    }
    if (code < 0x10000) {
        out[0] = (char)(0xE0 | (code >> 12));
        out[1] = (char)(0x80 | ((code >> 6) & 0x3F));
        out[2] = (char)(0x80 | (code & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (code >> 18));
    out[1] = (char)(0x80 | ((code >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((code >> 6) & 0x3F));
    out[3] = (char)(0x80 | (code & 0x3F));
    return 4;
}

/* \uXXXX, with surrogate pairs; a lone surrogate or \u0000 is refused. */
static bool parse_unicode_escape(struct parser *p, unsigned *code)
{
    if (!read_hex4(p, code))
        return false;
    if (*code >= 0xDC00 && *code <= 0xDFFF)
        return false;
    if (*code >= 0xD800 && *code <= 0xDBFF) {
        unsigned low;
        if (!literal(p, "\\u") || !read_hex4(p, &low) || low < 0xDC00 || low > 0xDFFF)
            return false;
        *code = 0x10000 + ((*code - 0xD800) << 10) + (low - 0xDC00);
    }
    return *code != 0;
}

static bool parse_escape(struct parser *p, char *out, size_t *n)
{
    char c = *p->at++;
    const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
    const char *hit = strchr(from, c);
    if (c != '\0' && hit != NULL) {
        out[(*n)++] = to[hit - from];
        return true;
    }
    unsigned code;
    if (c != 'u' || !parse_unicode_escape(p, &code))
        return false;
    *n += put_utf8(out + *n, code);
    return true;
}

/* A string; the output never grows longer than the input span, so one buffer the size
 * of the rest of the text is enough. */
static char *parse_string_raw(struct parser *p)
{
    if (p->at >= p->end || *p->at != '"')
        return NULL;
    p->at++;
    const char *close = p->at;
    while (close < p->end && *close != '"')
        close += (*close == '\\' && close + 1 < p->end) ? 2 : 1;
    if (close >= p->end)
        return NULL;
    char *out = malloc((size_t)(close - p->at) + 1);
    if (out == NULL)
        return NULL;
    size_t n = 0;
    while (p->at < close) {
        unsigned char c = (unsigned char)*p->at;
        if (c < 0x20)
            goto fail; /* control characters must be escaped */
        p->at++;
        if (c != '\\')
            out[n++] = (char)c;
        else if (p->at >= close || !parse_escape(p, out, &n))
            goto fail;
    }
    if (p->at != close)
        goto fail;
    p->at++;
    out[n] = '\0';
    return out;
fail:
    free(out);
    return NULL;
}

/* Appends one parsed item to a growing array (doubling), keeping the tree consistent for
 * json_free on failure. */
static bool grow(struct json *out, size_t *capacity, bool with_keys)
{
    if (out->count < *capacity)
        return true;
    size_t wanted = *capacity ? *capacity * 2 : 4;
    struct json *items = realloc(out->items, wanted * sizeof *items);
    if (items == NULL)
        return false;
    out->items = items;
    if (with_keys) {
        char **keys = realloc(out->keys, wanted * sizeof *keys);
        if (keys == NULL)
            return false;
        out->keys = keys;
    }
    *capacity = wanted;
    return true;
}

static bool parse_array(struct parser *p, struct json *out, int depth)
{
    size_t capacity = 0;
    out->type = JSON_ARRAY;
    p->at++;
    skip_space(p);
    if (p->at < p->end && *p->at == ']') {
        p->at++;
        return true;
    }
    for (;;) {
        if (!grow(out, &capacity, false))
            return false;
        struct json *item = &out->items[out->count];
        memset(item, 0, sizeof *item);
        out->count++;
        if (!parse_value(p, item, depth + 1))
            return false;
        skip_space(p);
        if (p->at >= p->end)
            return false;
        if (*p->at == ']') {
            p->at++;
            return true;
        }
        if (*p->at++ != ',')
            return false;
    }
}

static bool parse_object(struct parser *p, struct json *out, int depth)
{
    size_t capacity = 0;
    out->type = JSON_OBJECT;
    p->at++;
    skip_space(p);
    if (p->at < p->end && *p->at == '}') {
        p->at++;
        return true;
    }
    for (;;) {
        if (!grow(out, &capacity, true))
            return false;
        struct json *item = &out->items[out->count];
        memset(item, 0, sizeof *item);
        skip_space(p);
        out->keys[out->count] = parse_string_raw(p);
        if (out->keys[out->count] == NULL)
            return false;
        out->count++;
        skip_space(p);
        if (p->at >= p->end || *p->at++ != ':')
            return false;
        if (!parse_value(p, item, depth + 1))
            return false;
        skip_space(p);
        if (p->at >= p->end)
            return false;
        if (*p->at == '}') {
            p->at++;
            return true;
        }
        if (*p->at++ != ',')
            return false;
    }
}

static bool parse_value(struct parser *p, struct json *out, int depth)
{
    if (depth > MAX_DEPTH || ++p->nodes > MAX_NODES)
        return false;
    skip_space(p);
    if (p->at >= p->end)
        return false;
    switch (*p->at) {
    case '{':
        return parse_object(p, out, depth);
    case '[':
        return parse_array(p, out, depth);
    case '"':
        out->string = parse_string_raw(p);
        out->type = JSON_STRING;
        return out->string != NULL;
    case 't':
        out->type = JSON_BOOL;
        out->boolean = true;
        return literal(p, "true");
    case 'f':
        out->type = JSON_BOOL;
        return literal(p, "false");
    case 'n':
        out->type = JSON_NULL;
        return literal(p, "null");
    default:
        return parse_number(p, out);
    }
}

static void free_contents(struct json *value)
{
    if (value->type == JSON_STRING)
        free(value->string);
    if (value->type != JSON_ARRAY && value->type != JSON_OBJECT)
        return;
    for (size_t i = 0; i < value->count; i++) {
        free_contents(&value->items[i]);
        if (value->type == JSON_OBJECT)
            free(value->keys[i]);
    }
    free(value->items);
    free(value->keys);
}

void json_free(struct json *value)
{
    if (value == NULL)
        return;
    free_contents(value);
    free(value);
}

struct json *json_parse(const char *text, size_t length)
{
    struct parser p = { text, text + length, 0 };
    struct json *root = calloc(1, sizeof *root);
    if (root == NULL)
        return NULL;
    bool ok = parse_value(&p, root, 0);
    skip_space(&p);
    if (!ok || p.at != p.end) {
        json_free(root);
        return NULL;
    }
    return root;
}

const struct json *json_get(const struct json *object, const char *key)
{
    if (object == NULL || object->type != JSON_OBJECT)
        return NULL;
    for (size_t i = object->count; i-- > 0;)
        if (strcmp(object->keys[i], key) == 0)
            return &object->items[i];
    return NULL;
}

char *read_text_file(const char *path, size_t max_bytes, size_t *length)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat info;
    char *text = NULL;
    if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode) || (uintmax_t)info.st_size > max_bytes)
        goto done;
    /* Read up to one byte past the size stat gave: a file that grew is still refused
     * when it passes the limit. */
    size_t capacity = (size_t)info.st_size + 1, n = 0;
    text = malloc(capacity + 1);
    if (text == NULL)
        goto done;
    for (;;) {
        ssize_t got = read(fd, text + n, capacity - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            free(text);
            text = NULL;
            goto done;
        }
        if (got == 0)
            break;
        n += (size_t)got;
        if (n == capacity) { /* the file grew: refuse rather than chase it */
            free(text);
            text = NULL;
            goto done;
        }
    }
    text[n] = '\0';
    *length = n;
done:
    close(fd);
    return text;
}
