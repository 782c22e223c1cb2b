/* train/tokenizer*.c: decode and encode of Hugging Face tokenizer.json files.
 *
 * Encode: the corpus (tokenizer/corpus.bin.gz) through ten fixture tokenizers gives the ids of
 * the `tokenizers` library (tokenizer/<name>/expected_ids.bin.gz, made by
 * tokenizer/make_encode_fixtures.py), record by record, and decodes back to the text wherever
 * the library round-trips it.
 *
 * Decode:
 * Replays tests/tokenizer/expected.json (made by tests/tokenizer/make_fixtures.py with the
 * `tokenizers` library): for a byte-level BPE (Qwen2 style), a SentencePiece-style BPE with
 * byte fallback and the Llama 2 decoder sequence (Metaspace pre-tokenizer, and the legacy
 * Prepend/Replace normalizer with normalized added tokens), and a Metaspace decoder, every
 * sequence's bytes equal the library's decode where those are valid UTF-8 (skip_special
 * on and off), equal the recorded raw bytes everywhere, and for byte-level turn into the
 * library's string with from_utf8_lossy. token_bytes agrees with decode; ids without a
 * token, malformed and unsupported files are refused naming the problem; random
 * mutations of a file never crash. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "check.h"
#include "tokenizer/corpus.h"
#include "twinkle/tokenizer.h"
#include "twinkle/hal.h"


static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *d = malloc((size_t)sz + 1);
    if (d && fread(d, 1, (size_t)sz, f) != (size_t)sz) {
        free(d);
        d = NULL;
    }
    fclose(f);
    if (d) d[sz] = 0;
    if (n) *n = (size_t)sz;
    return d;
}

static int b64v(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* base64 -> malloc'd bytes (NUL-terminated), *n their count */
static char *unb64(const char *s, size_t *n) {
    size_t L = strlen(s), o = 0;
    char *out = malloc(L / 4 * 3 + 4);
    unsigned acc = 0;
    int bits = 0;
    for (size_t i = 0; i < L && s[i] != '='; i++) {
        int v = b64v((unsigned char)s[i]);
        if (v < 0) continue;
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (char)((acc >> bits) & 0xFF);
        }
    }
    out[o] = 0;
    *n = o;
    return out;
}

/* Rust's String::from_utf8_lossy (one U+FFFD per maximal invalid subpart), as the
 * library's ByteLevel decoder applies it. */
static char *lossy(const char *s, size_t n, size_t *on) {
    char *o = malloc(3 * n + 1);
    size_t k = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t len = 0;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80)
            len = 1;
        else if (c >= 0xC2 && c <= 0xDF)
            len = 2;
        else if (c == 0xE0)
            len = 3, lo = 0xA0;
        else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
            len = 3;
        else if (c == 0xED)
            len = 3, hi = 0x9F;
        else if (c == 0xF0)
            len = 4, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3)
            len = 4;
        else if (c == 0xF4)
            len = 4, hi = 0x8F;
        size_t j = 1;
        if (len > 1) {
            while (j < len && i + j < n) {
                unsigned b = u[i + j];
                if (j == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
                j++;
            }
        }
        if (len && j == len) {
            memcpy(o + k, s + i, len);
            k += len;
            i += len;
        } else {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i += j;
        }
    }
    o[k] = 0;
    *on = k;
    return o;
}

static int same(const char *a, size_t an, const char *b, size_t bn) { return an == bn && !memcmp(a, b, an); }

static void show(const char *what, const char *s, size_t n) {
    printf("       %s (%zu bytes): ", what, n);
    for (size_t i = 0; i < n && i < 200; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\')
            putchar(c);
        else
            printf("\\x%02x", c);
    }
    printf("\n");
}

/* decode(ids) == decode(ids[0..1)) + token_bytes(ids[1]) + ... (special ids dropped first
 * when skip); for byte-level also == the sum of every token_bytes. */
static int tb_consistent(const twk_tokenizer *t, const int32_t *ids, int n, int skip, int bytelevel) {
    int32_t *f = malloc(((size_t)n + 1) * sizeof *f);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (!skip || !twk_tokenizer_is_special(t, ids[i])) f[m++] = ids[i];
    char *full, *first;
    size_t fl, firstl;
    int ok = !twk_tokenizer_decode(t, ids, n, skip, &full, &fl);
    if (!ok) {
        free(f);
        return 0;
    }
    ok = !twk_tokenizer_decode(t, f, m ? 1 : 0, 0, &first, &firstl);
    size_t cap = firstl + 4096 * (size_t)n + 1;
    char *acc = malloc(cap), *all = malloc(cap);
    size_t al = 0, alll = 0;
    memcpy(acc, first, firstl);
    al = firstl;
    for (int i = 0; i < m && ok; i++) {
        char tmp[4096];
        int k = twk_tokenizer_token_bytes(t, f[i], tmp, sizeof tmp);
        if (k < 0 || k > (int)sizeof tmp || al + (size_t)k > cap || alll + (size_t)k > cap)
            ok = 0;
        else {
            if (i) memcpy(acc + al, tmp, (size_t)k), al += (size_t)k;
            memcpy(all + alll, tmp, (size_t)k), alll += (size_t)k;
        }
    }
    if (ok && !same(full, fl, acc, al)) ok = 0;
    if (ok && bytelevel && !same(full, fl, all, alll)) ok = 0;
    free(f);
    twk_host_free(full);
    twk_host_free(first);
    free(acc);
    free(all);
    return ok;
}

static void replay(const cJSON *exp, const char *name) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(exp, "tokenizers"), name);
    char dir[1024], file[1100];
    snprintf(dir, sizeof dir, "%s/%s", TWK_TOKENIZER_DIR, name);
    snprintf(file, sizeof file, "%s/tokenizer.json", dir);
    twk_tokenizer *t = NULL, *t2 = NULL;
    twk_status s = twk_tokenizer_load(dir, &t);
    check(!s && e, "%-10s loads from its folder%s%s", name, s ? ": " : "", s ? twk_last_error() : "");
    if (s || !e) return;
    s = twk_tokenizer_load(file, &t2);
    check(!s && twk_tokenizer_size(t2) == twk_tokenizer_size(t), "%-10s loads from the file path", name);
    twk_tokenizer_free(t2);
    int size = cJSON_GetObjectItemCaseSensitive(e, "size")->valueint;
    check(twk_tokenizer_size(t) == size, "%-10s size %d (library: max id + 1 = %d)", name, twk_tokenizer_size(t), size);
    int bytelevel = !strcmp(name, "bytelevel");
    int n_cases = 0, n_valid = 0, bad = 0, bad_tb = 0, bad_lossy = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(e, "cases")) {
        const cJSON *jids = cJSON_GetObjectItemCaseSensitive(c, "ids");
        int n = cJSON_GetArraySize(jids), valid = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "valid"));
        int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
        for (int i = 0; i < n; i++) ids[i] = cJSON_GetArrayItem(jids, i)->valueint;
        n_cases++;
        n_valid += valid;
        for (int skip = 0; skip < 2; skip++) {
            size_t tl, rl, ol, ll;
            char *text =
                unb64(cJSON_GetObjectItemCaseSensitive(c, skip ? "text_skip_b64" : "text_b64")->valuestring, &tl);
            char *raw = unb64(cJSON_GetObjectItemCaseSensitive(c, skip ? "raw_skip_b64" : "raw_b64")->valuestring, &rl);
            char *out = NULL;
            s = twk_tokenizer_decode(t, ids, n, skip, &out, &ol);
            int ok = !s && same(out, ol, raw, rl) && (!valid || same(out, ol, text, tl)) && out[ol] == 0;
            if (!ok) {
                if (bad++ < 5) {
                    printf("FAIL %-10s case %d (%d ids, skip_special=%d): %s\n", name, n_cases - 1, n, skip,
                           s ? twk_last_error() : "bytes differ");
                    if (!s) show("twinkle", out, ol), show("expected raw", raw, rl), show("library", text, tl);
                }
            }
            if (!s && bytelevel) { /* the library's string from these bytes, invalid UTF-8 included */
                char *l = lossy(out, ol, &ll);
                if (!same(l, ll, text, tl) && bad_lossy++ < 3) {
                    printf("FAIL %-10s case %d skip=%d: from_utf8_lossy(bytes) != library\n", name, n_cases - 1, skip);
                    show("lossy", l, ll), show("library", text, tl);
                }
                free(l);
            }
            if (!tb_consistent(t, ids, n, skip, bytelevel) && bad_tb++ < 3)
                printf("FAIL %-10s case %d skip=%d: decode != decode(first) + token_bytes(rest)\n", name, n_cases - 1,
                       skip);
            twk_host_free(out);
            free(text);
            free(raw);
        }
        free(ids);
    }
    check(!bad,
          "%-10s %d sequences x skip_special 0/1: bytes = library's where valid UTF-8 (%d), = raw reference (all)",
          name, n_cases, n_valid);
    if (bytelevel)
        check(!bad_lossy, "%-10s from_utf8_lossy(twinkle's bytes) = library's string, invalid UTF-8 included", name);
    check(!bad_tb, "%-10s decode = decode(first) + token_bytes(rest)%s", name,
          bytelevel ? "; = sum of token_bytes" : " (first token: the caller's leading-space rule)");

    /* Long random sequences: the token_bytes identity, and no crash. */
    unsigned seed = 12345;
    int okr = 1;
    for (int r = 0; r < 20; r++) {
        int32_t ids[500];
        for (int i = 0; i < 500; i++) {
            seed = seed * 1103515245u + 12345u;
            ids[i] = (int32_t)((seed >> 8) % (unsigned)size);
        }
        okr &= tb_consistent(t, ids, 500, r & 1, bytelevel);
    }
    check(okr, "%-10s 20 random sequences of 500 ids: decode = decode(first) + token_bytes(rest)", name);

    /* ids without a token */
    int32_t bad_ids[3] = {0, size, 1};
    char *out = NULL;
    s = twk_tokenizer_decode(t, bad_ids, 3, 0, &out, NULL);
    check(s == TWK_ERR_INVALID_ARG && strstr(twk_last_error(), "position 1") && !out,
          "%-10s id %d (= size) refused: %s", name, size, twk_last_error());
    bad_ids[1] = -5;
    s = twk_tokenizer_decode(t, bad_ids, 3, 1, &out, NULL);
    check(s == TWK_ERR_INVALID_ARG && strstr(twk_last_error(), "position 1"), "%-10s id -5 refused: %s", name,
          twk_last_error());
    check(twk_tokenizer_token_bytes(t, size, NULL, 0) == -1 && twk_tokenizer_token_bytes(t, -1, NULL, 0) == -1,
          "%-10s token_bytes of unknown ids is -1", name);
    twk_tokenizer_free(t);
}

/* Raw bytes: a character split across tokens comes out as its bytes, not U+FFFD. */
static void raw_bytes(void) {
    static const struct {
        const char *name, *tok[3];
    } cases[] = {
        /* byte-level: U+4E2D (E4 B8 AD) as the byte tokens "ä" "¸" "Ń" (0xAD has no slot of its own) */
        {"bytelevel", {"\xc3\xa4", "\xc2\xb8", "\xc5\x83"}},
        {"sp", {"<0xE4>", "<0xB8>", "<0xAD>"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/%s", TWK_TOKENIZER_DIR, cases[c].name);
        twk_tokenizer *t = NULL;
        if (twk_tokenizer_load(dir, &t)) {
            check(0, "%s loads: %s", cases[c].name, twk_last_error());
            continue;
        }
        int32_t ids[3];
        int ok = 1;
        for (int i = 0; i < 3; i++)
            ok &= (ids[i] = twk_tokenizer_token_id(t, cases[c].tok[i], strlen(cases[c].tok[i]))) >= 0;
        char *o1 = NULL, *o2 = NULL, *o3 = NULL, tb[8];
        size_t n1 = 0, n2 = 0, n3 = 0;
        ok = ok && !twk_tokenizer_decode(t, ids, 1, 0, &o1, &n1) && !twk_tokenizer_decode(t, ids, 2, 0, &o2, &n2) &&
             !twk_tokenizer_decode(t, ids, 3, 0, &o3, &n3);
        ok = ok && same(o1, n1, "\xe4", 1) && same(o2, n2, "\xe4\xb8", 2) && same(o3, n3, "\xe4\xb8\xad", 3);
        ok = ok && twk_tokenizer_token_bytes(t, ids[1], tb, sizeof tb) == 1 && tb[0] == '\xb8';
        check(ok, "%-10s U+4E2D split over 3 byte tokens: decodes to E4 / E4 B8 / E4 B8 AD, token_bytes B8",
              cases[c].name);
        twk_host_free(o1);
        twk_host_free(o2);
        twk_host_free(o3);
        twk_tokenizer_free(t);
    }
}

/* ---- hand-made files ----------------------------------------------------------------------- */

static char tmpdir[256];

static char *write_tmp(const char *name, const char *text, size_t n) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    fwrite(text, 1, n, f);
    fclose(f);
    return path;
}

static void expect_error(const char *name, const char *json, twk_status code, const char *want1, const char *want2) {
    const char *p = write_tmp(name, json, strlen(json));
    twk_tokenizer *t = (twk_tokenizer *)0x1;
    twk_status s = twk_tokenizer_load(p, &t);
    const char *m = twk_last_error();
    int ok = s == code && t == NULL && strstr(m, name) && (!want1 || strstr(m, want1)) && (!want2 || strstr(m, want2));
    check(ok, "%-22s -> %s: %s", name, twk_status_name(s), m);
    if (!s) twk_tokenizer_free(t);
}

#define ADDED_S                                                                                                        \
    "{\"id\":3,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,"      \
    "\"special\":true}"
#define BL_DEC "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true}"
#define VOCAB "{\"a\":0,\"b\":1,\"\\u0120c\":2}"

static char *doc(char *buf, size_t cap, const char *added, const char *norm, const char *dec, const char *model) {
    snprintf(buf, cap,
             "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[%s],\"normalizer\":%s,"
             "\"pre_tokenizer\":null,\"post_processor\":null,\"decoder\":%s,\"model\":%s}",
             added, norm, dec, model);
    return buf;
}

static void malformed(void) {
    char b[4096];
    const char *bpe = "{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"vocab\":" VOCAB ",\"merges\":[]}";
    expect_error("empty.json", "", TWK_ERR_INVALID_ARG, "invalid JSON", "line 1"); /* empty file */
    expect_error("bad_json.json", "{\"model\": {\"type\": \"BPE\",\n  \"vocab\": {\"a\": 0,}", TWK_ERR_INVALID_ARG,
                 "invalid JSON", "line 2");
    expect_error("top_array.json", "[1, 2]", TWK_ERR_INVALID_ARG, "not a JSON object", NULL);
    expect_error("no_model.json", "{\"added_tokens\":[]}", TWK_ERR_INVALID_ARG, "'model'", NULL);
    expect_error("wordpiece.json",
                 doc(b, sizeof b, "", "null", "null",
                     "{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\",\"vocab\":{\"[UNK]\":0}}"),
                 TWK_ERR_UNSUPPORTED, "model type 'WordPiece'", NULL);
    expect_error("unigram.json",
                 doc(b, sizeof b, "", "null", "null", "{\"type\":\"Unigram\",\"unk_id\":0,\"vocab\":[[\"a\",-1.0]]}"),
                 TWK_ERR_UNSUPPORTED, "'Unigram'", NULL);
    expect_error("untyped_model.json", doc(b, sizeof b, "", "null", "null", "{\"vocab\":{\"a\":0},\"merges\":[]}"),
                 TWK_ERR_UNSUPPORTED, "no 'type'", NULL);
    expect_error("dec_wordpiece.json",
                 doc(b, sizeof b, "", "null", "{\"type\":\"WordPiece\",\"prefix\":\"##\",\"cleanup\":true}", bpe),
                 TWK_ERR_UNSUPPORTED, "decoder type 'WordPiece'", NULL);
    expect_error(
        "dec_ctc_in_seq.json",
        doc(b, sizeof b, "", "null",
            "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Fuse\"},{\"type\":\"CTC\",\"pad_token\":\"<pad>\"}]}",
            bpe),
        TWK_ERR_UNSUPPORTED, "'CTC'", NULL);
    expect_error("dec_regex.json",
                 doc(b, sizeof b, "", "null",
                     "{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"\\\\s+\"},\"content\":\" \"}", bpe),
                 TWK_ERR_UNSUPPORTED, "Regex", NULL);
    expect_error("dec_strip_two_chars.json",
                 doc(b, sizeof b, "", "null", "{\"type\":\"Strip\",\"content\":\"ab\",\"start\":1,\"stop\":0}", bpe),
                 TWK_ERR_INVALID_ARG, "Strip", NULL);
    expect_error("dec_metaspace_norep.json", doc(b, sizeof b, "", "null", "{\"type\":\"Metaspace\"}", bpe),
                 TWK_ERR_INVALID_ARG, "replacement", NULL);
    expect_error("dec_metaspace_aps.json",
                 doc(b, sizeof b, "", "null",
                     "{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"add_prefix_space\":false}", bpe),
                 TWK_ERR_INVALID_ARG, "add_prefix_space", NULL);
    expect_error("version.json", "{\"version\":\"2.0\",\"model\":{\"type\":\"BPE\",\"vocab\":{}}}", TWK_ERR_UNSUPPORTED,
                 "version", NULL);
    expect_error("id_negative.json", doc(b, sizeof b, "", "null", BL_DEC, "{\"type\":\"BPE\",\"vocab\":{\"a\":-1}}"),
                 TWK_ERR_INVALID_ARG, "model.vocab['a']", NULL);
    expect_error("id_fraction.json", doc(b, sizeof b, "", "null", BL_DEC, "{\"type\":\"BPE\",\"vocab\":{\"a\":1.5}}"),
                 TWK_ERR_INVALID_ARG, "model.vocab['a']", "integer");
    expect_error("id_string.json", doc(b, sizeof b, "", "null", BL_DEC, "{\"type\":\"BPE\",\"vocab\":{\"a\":\"0\"}}"),
                 TWK_ERR_INVALID_ARG, "model.vocab['a']", NULL);
    expect_error("id_past_limit.json",
                 doc(b, sizeof b, "", "null", BL_DEC, "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":4294967296}}"),
                 TWK_ERR_INVALID_ARG, "model.vocab['b']", "16777215");
    expect_error("id_sparse.json",
                 doc(b, sizeof b, "", "null", BL_DEC, "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":9000000}}"),
                 TWK_ERR_INVALID_ARG, "holes", NULL);
    expect_error("id_twice.json",
                 doc(b, sizeof b, "", "null", BL_DEC, "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0}}"),
                 TWK_ERR_INVALID_ARG, "both have id 0", NULL);
    expect_error("key_twice.json",
                 doc(b, sizeof b, "", "null", BL_DEC, "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"a\":1}}"),
                 TWK_ERR_INVALID_ARG, "'a' appears twice", NULL);
    expect_error("added_bad_id.json",
                 doc(b, sizeof b,
                     "{\"id\":7,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
                     "\"normalized\":false,\"special\":true}",
                     "null", BL_DEC, bpe),
                 TWK_ERR_INVALID_ARG, "('<s>') has id 7", "gives it id 3");
    expect_error("added_past_vocab.json",
                 doc(b, sizeof b, "{\"id\":99999999,\"content\":\"<s>\",\"special\":true}", "null", BL_DEC, bpe),
                 TWK_ERR_INVALID_ARG, "added_tokens[0]", "'id'");
    expect_error("added_no_content.json", doc(b, sizeof b, "{\"id\":3,\"special\":true}", "null", BL_DEC, bpe),
                 TWK_ERR_INVALID_ARG, "added_tokens[0]", "content");
    expect_error("added_flag_type.json",
                 doc(b, sizeof b, "{\"id\":3,\"content\":\"<s>\",\"special\":\"yes\"}", "null", BL_DEC, bpe),
                 TWK_ERR_INVALID_ARG, "'<s>'", "booleans");
    expect_error("added_lower.json",
                 doc(b, sizeof b, "{\"id\":3,\"content\":\"\\u00c9\",\"normalized\":true,\"special\":false}",
                     "{\"type\":\"Lowercase\"}", BL_DEC, bpe),
                 TWK_ERR_UNSUPPORTED, "Lowercase of non-ASCII", NULL);
    expect_error("added_bert.json",
                 doc(b, sizeof b, "{\"id\":3,\"content\":\"<x>\",\"normalized\":true,\"special\":false}",
                     "{\"type\":\"BertNormalizer\",\"lowercase\":true}", BL_DEC, bpe),
                 TWK_ERR_UNSUPPORTED, "'BertNormalizer'", NULL);
    expect_error("nul_escape.json",
                 doc(b, sizeof b, "", "null", BL_DEC, "{\"type\":\"BPE\",\"vocab\":{\"a\\u0000b\":0}}"),
                 TWK_ERR_UNSUPPORTED, "\\u0000", NULL);
    const char *latin1 = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"caf\xe9\":0}}}";
    expect_error("not_utf8.json", latin1, TWK_ERR_INVALID_ARG, "UTF-8", NULL);

    twk_tokenizer *t = NULL;
    char path[600];
    snprintf(path, sizeof path, "%s/missing.json", tmpdir);
    twk_status s = twk_tokenizer_load(path, &t);
    check(s == TWK_ERR_IO && strstr(twk_last_error(), "missing.json"), "missing file -> %s: %s", twk_status_name(s),
          twk_last_error());
    s = twk_tokenizer_load(tmpdir, &t);
    check(s == TWK_ERR_IO && strstr(twk_last_error(), "tokenizer.json"), "folder without tokenizer.json -> %s: %s",
          twk_status_name(s), twk_last_error());
}

/* Small valid files: holes, no decoder, token_id, token_bytes' cap, the library's rules. */
static void handmade(void) {
    char b[4096];
    twk_tokenizer *t = NULL;
    char *out = NULL;
    size_t n;
    /* vocab with a hole at 1; <s> takes id 2 (= the vocab's count) */
    doc(b, sizeof b,
        "{\"id\":2,\"content\":\"<s>\",\"normalized\":false,\"special\":true},"
        "{\"id\":0,\"content\":\"a\",\"normalized\":false,\"special\":false}",
        "null", BL_DEC, "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"\\u0120c\":3},\"merges\":[]}");
    const char *p = write_tmp("holes.json", b, strlen(b));
    twk_status s = twk_tokenizer_load(p, &t);
    check(!s && twk_tokenizer_size(t) == 4, "holes.json loads, size 4%s%s", s ? ": " : "", s ? twk_last_error() : "");
    if (!s) {
        int32_t ids[4] = {0, 3, 2, 1};
        s = twk_tokenizer_decode(t, ids, 3, 0, &out, &n);
        check(!s && same(out, n, "a c<s>", 6), "decode [a, Ġc, <s>] = \"a c<s>\"");
        twk_host_free(out);
        s = twk_tokenizer_decode(t, ids, 4, 0, &out, &n);
        check(s == TWK_ERR_INVALID_ARG && strstr(twk_last_error(), "position 3") && strstr(twk_last_error(), "hole"),
              "a hole is refused naming the position: %s", twk_last_error());
        check(twk_tokenizer_token_bytes(t, 1, NULL, 0) == -1, "token_bytes of a hole is -1");
        check(twk_tokenizer_token_id(t, "<s>", 3) == 2 &&
                  twk_tokenizer_token_id(t,
                                         "\xc4\xa0"
                                         "c",
                                         3) == 3 &&
                  twk_tokenizer_token_id(t, "zz", 2) == -1,
              "token_id finds added and vocab strings");
        check(twk_tokenizer_is_special(t, 2) && !twk_tokenizer_is_special(t, 0), "is_special: <s> yes, a no");
        char small[2] = {'x', 'x'};
        int k = twk_tokenizer_token_bytes(t, 2, small, 2);
        check(k == 3 && small[0] == '<' && small[1] == 's',
              "token_bytes with a small cap: full count 3, 2 bytes written");
        check(twk_tokenizer_token_bytes(t, 2, NULL, 0) == 3, "token_bytes(NULL, 0) sizes the token");
        s = twk_tokenizer_decode(t, ids, 0, 0, &out, &n);
        check(!s && n == 0 && out && out[0] == 0, "decode of no ids is \"\"");
        twk_host_free(out);
        twk_tokenizer_free(t);
    }
    /* no decoder: the library joins the tokens with spaces */
    doc(b, sizeof b, ADDED_S, "null", "null", "{\"type\":\"BPE\",\"vocab\":" VOCAB ",\"merges\":[]}");
    p = write_tmp("nodecoder.json", b, strlen(b));
    s = twk_tokenizer_load(p, &t);
    if (!s) {
        int32_t ids[4] = {0, 3, 1, 2};
        s = twk_tokenizer_decode(t, ids, 4, 0, &out, &n);
        check(!s && same(out, n,
                         "a <s> b \xc4\xa0"
                         "c",
                         11),
              "no decoder: tokens joined with \" \"");
        twk_host_free(out);
        s = twk_tokenizer_decode(t, ids, 4, 1, &out, &n);
        check(!s && same(out, n,
                         "a b \xc4\xa0"
                         "c",
                         7),
              "no decoder, skip_special");
        twk_host_free(out);
        check(tb_consistent(t, ids, 4, 0, 0), "no decoder: token_bytes carries the joining space");
        twk_tokenizer_free(t);
    } else {
        check(0, "nodecoder.json loads: %s", twk_last_error());
    }
    /* ByteLevel keeps a token with a char outside the byte table as it is; Strip after
     * Fuse cuts one leading space; Metaspace with prepend_scheme never keeps spaces */
    doc(b, sizeof b, "", "null",
        "{\"type\":\"Sequence\",\"decoders\":[" BL_DEC
        ",{\"type\":\"Strip\",\"content\":\" \",\"start\":2,\"stop\":1}]}",
        "{\"type\":\"BPE\",\"vocab\":{\"\\u0120\\u0120x\":0,\"y \":1,\"\\u20ac\":2,\"\\u0120\":3}}");
    p = write_tmp("chain.json", b, strlen(b));
    s = twk_tokenizer_load(p, &t);
    if (!s) {
        int32_t ids[4] = {0, 2, 1, 3};
        s = twk_tokenizer_decode(t, ids, 4, 0, &out, &n);
        /* "  x" + "\xe2\x82\xac" (€ is in no byte slot: kept) + "y " (space: kept) + " " -> strip 2 / 1 */
        check(!s && same(out, n, "x\xe2\x82\xacy ", 6), "ByteLevel keeps unmapped tokens; Strip(start 2, stop 1)");
        twk_host_free(out);
        twk_tokenizer_free(t);
    } else {
        check(0, "chain.json loads: %s", twk_last_error());
    }
    doc(b, sizeof b, "", "null",
        "{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"never\",\"split\":true}",
        "{\"type\":\"BPE\",\"vocab\":{\"\\u2581a\":0,\"\\u2581b\\u2581\":1}}");
    p = write_tmp("meta_never.json", b, strlen(b));
    s = twk_tokenizer_load(p, &t);
    if (!s) {
        int32_t ids[2] = {0, 1};
        s = twk_tokenizer_decode(t, ids, 2, 0, &out, &n);
        check(!s && same(out, n, " a b ", 5), "Metaspace prepend_scheme never: the first token keeps its space");
        twk_host_free(out);
        twk_tokenizer_free(t);
    } else {
        check(0, "meta_never.json loads: %s", twk_last_error());
    }
}

/* Random mutations of a valid file: load either works or fails with a message; what loads
 * decodes every id. */
static void mutations(void) {
    char base[4096];
    doc(base, sizeof base, ADDED_S ",{\"id\":4,\"content\":\"<pad>\",\"normalized\":true,\"special\":false}",
        "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\\u2581\"},"
        "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}]}",
        "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},\"content\":"
        "\" \"},"
        "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" "
        "\",\"start\":1,\"stop\":0}]}",
        "{\"type\":\"BPE\",\"byte_fallback\":true,\"vocab\":{\"<0x41>\":0,\"<0xE2>\":1,\"\\u2581x\":2},\"merges\":[]}");
    size_t bl = strlen(base);
    const char alpha[] = "{}[]\":,019-.e\\uab \x80\xe2";
    unsigned seed = 99;
    int loaded = 0, encoded = 0, crashed_msgs = 0;
    char m[4200];
    for (int it = 0; it < 3000; it++) {
        memcpy(m, base, bl + 1);
        size_t ml = bl;
        int k = 1 + it % 3;
        for (int j = 0; j < k; j++) {
            seed = seed * 1103515245u + 12345u;
            size_t pos = (seed >> 8) % ml;
            seed = seed * 1103515245u + 12345u;
            int op = (seed >> 8) % 3;
            if (op == 0)
                m[pos] = alpha[(seed >> 12) % (sizeof alpha - 1)];
            else if (op == 1 && ml > 1)
                memmove(m + pos, m + pos + 1, ml - pos), ml--;
            else if (ml + 1 < sizeof m)
                memmove(m + pos + 1, m + pos, ml - pos + 1), ml++, m[pos] = m[(pos * 7) % ml];
        }
        const char *p = write_tmp("mutant.json", m, ml);
        twk_tokenizer *t = NULL;
        twk_status s = twk_tokenizer_load(p, &t);
        if (s) {
            crashed_msgs += !twk_last_error()[0];
            continue;
        }
        loaded++;
        int32_t sz = twk_tokenizer_size(t);
        for (int32_t id = 0; id < sz; id++) {
            char tmp[64];
            if (twk_tokenizer_token_bytes(t, id, tmp, sizeof tmp) < 0) continue;
            char *out;
            size_t n;
            if (!twk_tokenizer_decode(t, &id, 1, id & 1, &out, &n)) twk_host_free(out);
        }
        static const char text[] = " A x<pad><s>\xe2\x96\x81x \xe2\x82\xac\xff<s> ";
        int32_t *ids = NULL;
        int64_t n = 0;
        twk_status es = twk_tokenizer_encode(t, text, sizeof text - 1, it & 1, &ids, &n);
        if (es) {
            crashed_msgs += !twk_last_error()[0];
        } else {
            encoded++;
            twk_host_free(ids);
        }
        twk_tokenizer_free(t);
    }
    check(!crashed_msgs, "3000 random mutations: no crash, %d loaded (%d of them encode), every refusal has a message",
          loaded, encoded);
}

/* ---- encoding --------------------------------------------------------------------------------- */

static const char *const enc_fixtures[] = {"bytelevel", "sp",     "sp_legacy", "metaspace",  "gpt2",
                                           "llama3",    "qwen2",  "llama2",    "mistral",    "nfkc",
                                           "llama2_eos", "mistral_nobos", "llama3_cfg"};

static void show_ids(const char *what, const int32_t *v, int64_t n, int64_t at) {
    printf("       %s:", what);
    for (int64_t i = at > 3 ? at - 3 : 0; i < n && i < at + 6; i++) printf("%s%d", i == at ? " [" : " ", v[i]);
    printf("%s (%lld ids)\n", at < n ? "]" : " [end]", (long long)n);
}

typedef struct {
    const twk_tokenizer *t;
    const tk_corpus *x;
    int64_t from, step, same;
} enc_job;

static void *enc_thread(void *arg) {
    enc_job *j = arg;
    for (int64_t r = j->from; r < j->x->n; r += j->step) {
        int32_t *ids;
        int64_t n;
        const char *text = j->x->data + j->x->off[r];
        if (twk_tokenizer_encode(j->t, text, j->x->off[r + 1] - j->x->off[r], true, &ids, &n)) continue;
        j->same += n == j->x->n_ids[r] && !memcmp(ids, j->x->ids[r], (size_t)n * sizeof *ids);
        twk_host_free(ids);
    }
    return NULL;
}

/* Four threads encode the corpus with one tokenizer at once (sharing its word cache). */
static void encode_threads(const twk_tokenizer *t, const tk_corpus *x, const char *name) {
    enum { NT = 4 };
    pthread_t th[NT];
    enc_job jobs[NT];
    int started = 0;
    for (int i = 0; i < NT; i++) {
        jobs[i] = (enc_job){t, x, i, NT, 0};
        started += !pthread_create(&th[i], NULL, enc_thread, &jobs[i]);
    }
    int64_t same = 0;
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        same += jobs[i].same;
    }
    check(started == NT && same == x->n, "%-9s encode from %d threads at once: %lld of %lld records identical", name,
          NT, (long long)same, (long long)x->n);
}

/* Every record of the corpus through every fixture: ids equal the library's (add_special on),
 * and decode(encode(x)) == x (add_special off) wherever the library round-trips x. */
static void encode_corpus(void) {
    tk_corpus corpus;
    if (tk_corpus_read(TWK_TOKENIZER_DIR "/corpus.bin.gz", &corpus)) {
        check(0, "corpus.bin.gz read");
        return;
    }
    printf("     corpus: %lld records, %zu bytes\n", (long long)corpus.n, corpus.bytes);
    for (size_t f = 0; f < sizeof enc_fixtures / sizeof *enc_fixtures; f++) {
        const char *name = enc_fixtures[f];
        char path[600];
        snprintf(path, sizeof path, "%s/%s/expected_ids.bin.gz", TWK_TOKENIZER_DIR, name);
        tk_corpus x = corpus;
        x.ids = NULL, x.n_ids = NULL, x.flags = NULL;
        twk_tokenizer *t = NULL;
        snprintf(path + strlen(path) - strlen("expected_ids.bin.gz"), 40, "tokenizer.json");
        twk_status st = twk_tokenizer_load(path, &t);
        snprintf(path + strlen(path) - strlen("tokenizer.json"), 40, "expected_ids.bin.gz");
        if (st || tk_expected_read(path, &x)) {
            check(0, "%s: load (%s) and expected ids", name, twk_last_error());
            twk_tokenizer_free(t);
            x.data = NULL, x.off = NULL;
            tk_corpus_free(&x);
            continue;
        }
        int64_t same_ids = 0, n_ids = 0, rt_want = 0, rt_ok = 0, shown = 0;
        for (int64_t r = 0; r < x.n; r++) {
            const char *text = x.data + x.off[r];
            size_t len = x.off[r + 1] - x.off[r];
            int32_t *ids = NULL;
            int64_t n = 0;
            st = twk_tokenizer_encode(t, text, len, true, &ids, &n);
            int64_t at = 0;
            while (!st && at < n && at < x.n_ids[r] && ids[at] == x.ids[r][at]) at++;
            int ok = !st && n == x.n_ids[r] && at == n;
            same_ids += ok;
            n_ids += x.n_ids[r];
            if (!ok && shown++ < 3) {
                printf("FAIL %s: record %lld (%zu bytes) differs at id %lld%s%s\n", name, (long long)r, len,
                       (long long)at, st ? ": " : "", st ? twk_last_error() : "");
                show("text", text, len < 160 ? len : 160);
                show_ids("want", x.ids[r], x.n_ids[r], at);
                show_ids("got ", ids, n, at);
            }
            twk_host_free(ids);
            if (!(x.flags[r] & 1)) continue;
            rt_want++;
            char *dec = NULL;
            size_t dn = 0, ln;
            char *want = lossy(text, len, &ln);
            if (!twk_tokenizer_encode(t, text, len, false, &ids, &n) &&
                !twk_tokenizer_decode(t, ids, n, false, &dec, &dn) && same(dec, dn, want, ln))
                rt_ok++;
            else if (shown++ < 3)
                printf("FAIL %s: record %lld does not round-trip\n", name, (long long)r);
            free(want);
            twk_host_free(dec);
            twk_host_free(ids);
        }
        check(same_ids == x.n, "%-9s encode: ids identical to the library's on %lld of %lld records (%lld ids)", name,
              (long long)same_ids, (long long)x.n, (long long)n_ids);
        check(rt_ok == rt_want, "%-9s decode(encode(x)) == x on %lld of the %lld records the library round-trips",
              name, (long long)rt_ok, (long long)rt_want);
        if (!strcmp(name, "qwen2")) encode_threads(t, &x, name);
        twk_tokenizer_free(t);
        x.data = NULL, x.off = NULL;
        tk_corpus_free(&x);
    }
    tk_corpus_free(&corpus);
}

static int64_t enc(const twk_tokenizer *t, const char *s, size_t n, bool special, int32_t *out, int cap) {
    int32_t *ids = NULL;
    int64_t k = -1;
    if (twk_tokenizer_encode(t, s, n, special, &ids, &k)) return -1;
    for (int64_t i = 0; i < k && i < cap; i++) out[i] = ids[i];
    twk_host_free(ids);
    return k;
}

/* Invalid UTF-8 is U+FFFD per maximal subpart; add_special adds the template's ids; an
 * unsupported regex leaves decode working and makes encode fail naming it. */
static void encode_cases(void) {
    twk_tokenizer *t = NULL;
    if (twk_tokenizer_load(TWK_TOKENIZER_DIR "/qwen2", &t)) {
        check(0, "qwen2 load: %s", twk_last_error());
        return;
    }
    int32_t a[64], b[64];
    int64_t na = enc(t, "x\xff\xe2\x82y\xed\xa0\x80", 8, false, a, 64);
    int64_t nb = enc(t, "x\xef\xbf\xbd\xef\xbf\xbdy\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 17, false, b, 64);
    check(na > 0 && na == nb && !memcmp(a, b, (size_t)na * sizeof *a),
          "invalid UTF-8 encodes as its U+FFFD replacement (%lld ids)", (long long)na);
    int32_t *ids = NULL;
    int64_t n = -1;
    check(!twk_tokenizer_encode(t, "", 0, true, &ids, &n) && n == 0 && ids, "empty text: no ids");
    twk_host_free(ids);
    check(twk_tokenizer_encode(t, NULL, 3, false, &ids, &n) == TWK_ERR_INVALID_ARG, "NULL text refused");
    twk_tokenizer_free(t);
    if (twk_tokenizer_load(TWK_TOKENIZER_DIR "/mistral", &t)) {
        check(0, "mistral load: %s", twk_last_error());
        return;
    }
    na = enc(t, "Hello world", 11, false, a, 64);
    nb = enc(t, "Hello world", 11, true, b, 64);
    check(na > 0 && nb == na + 2 && b[0] == 1 && b[nb - 1] == 2 && !memcmp(a, b + 1, (size_t)na * sizeof *a),
          "add_special: <s> ... </s> around the %lld ids", (long long)na);
    twk_tokenizer_free(t);
    char doc_[2000];
    snprintf(doc_, sizeof doc_,
             "{\"version\":\"1.0\",\"added_tokens\":[],\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Split\","
             "\"pattern\":{\"Regex\":\"\\\\w+\"},\"behavior\":\"Isolated\",\"invert\":false},\"post_processor\":null,"
             "\"decoder\":%s,\"model\":{\"type\":\"BPE\",\"vocab\":%s,\"merges\":[]}}",
             BL_DEC, VOCAB);
    const char *p = write_tmp("enc_regex.json", doc_, strlen(doc_));
    if (twk_tokenizer_load(p, &t)) {
        check(0, "enc_regex.json load: %s", twk_last_error());
        return;
    }
    char *d = NULL;
    int32_t one = 0;
    twk_status ds = twk_tokenizer_decode(t, &one, 1, false, &d, NULL);
    twk_host_free(d);
    twk_status es = twk_tokenizer_encode(t, "a", 1, false, &ids, &n);
    check(!ds && es == TWK_ERR_UNSUPPORTED && strstr(twk_last_error(), "Split"),
          "an unknown Split regex: decode works, encode is refused: %s", twk_last_error());
    twk_tokenizer_free(t);
}

/* ---- tokenizer_config.json (transformers 4.x's rule; see train/tokenizer_config.c) ------------- */

static const char *const cfg_files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                        "config.json"};

/* tmpdir/NAME holding a link to fixture BASE's tokenizer.json and the given files (NULL: none). */
static const char *cfg_folder(const char *name, const char *base, const char *cfg, const char *stm,
                              const char *conf) {
    static char dir[400];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, name);
    mkdir(dir, 0755);
    const char *text[] = {NULL, cfg, stm, conf};
    for (int i = 0; i < 4; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", dir, cfg_files[i]);
        unlink(p);
        if (i == 0) {
            char target[600];
            snprintf(target, sizeof target, "%s/%s/tokenizer.json", TWK_TOKENIZER_DIR, base);
            if (symlink(target, p)) perror("symlink");
        } else if (text[i]) {
            FILE *f = fopen(p, "wb");
            fputs(text[i], f);
            fclose(f);
        }
    }
    return dir;
}

static void cfg_cleanup(const char *name) {
    char p[600];
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s/%s", tmpdir, name, cfg_files[i]);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    rmdir(p);
}

/* "Hello world" with add_special through a folder: the ids transformers 4.57's AutoTokenizer gives
 * (want; n_want < 0: encode fails naming want_msg, decode still working). */
static void cfg_case(const char *name, const char *base, const char *cfg, const char *stm, const char *conf,
                     const int32_t *want, int n_want, const char *want_msg) {
    const char *dir = cfg_folder(name, base, cfg, stm, conf);
    twk_tokenizer *t = NULL;
    if (twk_tokenizer_load(dir, &t)) {
        check(0, "config %s: load: %s", name, twk_last_error());
        cfg_cleanup(name);
        return;
    }
    int32_t got[64];
    int64_t n = enc(t, "Hello world", 11, true, got, 64);
    if (n_want >= 0) {
        const int32_t *pre, *suf;
        int np, ns;
        int32_t plain[64];
        int64_t k = enc(t, "Hello world", 11, false, plain, 64);
        int ok = n == n_want && !memcmp(got, want, (size_t)n_want * sizeof *want) &&
                 !twk_tokenizer_special_ids(t, &pre, &np, &suf, &ns) && np + k + ns == n &&
                 (!np || !memcmp(pre, got, (size_t)np * sizeof *pre)) &&
                 (!ns || !memcmp(suf, got + n - ns, (size_t)ns * sizeof *suf));
        check(ok, "config %-14s ids as transformers 4.57 (%lld ids: %d before, %d after the text)", name,
              (long long)n, np, ns);
    } else {
        const char *m = n < 0 ? twk_last_error() : "";
        char *d = NULL;
        int32_t one = 5;
        twk_status ds = twk_tokenizer_decode(t, &one, 1, false, &d, NULL);
        twk_host_free(d);
        const int32_t *pre, *suf;
        int np, ns;
        twk_status ss = twk_tokenizer_special_ids(t, &pre, &np, &suf, &ns);
        check(n < 0 && strstr(m, want_msg) && !ds && ss != TWK_OK, "config %-14s refused, decode works: %s", name, m);
    }
    twk_tokenizer_free(t);
    cfg_cleanup(name);
}

static void config_cases(void) {
    /* mistral's tokenizer.json: "Hello world" is these 9 ids, its template "<s> $A </s>" */
    const int32_t hw[] = {389, 75, 309, 452, 318, 512, 460, 315, 308};
    int32_t bos_hw[10] = {1}, hw_eos[10], bos_hw_eos[11] = {1};
    memcpy(bos_hw + 1, hw, sizeof hw);
    memcpy(hw_eos, hw, sizeof hw), hw_eos[9] = 2;
    memcpy(bos_hw_eos + 1, hw, sizeof hw), bos_hw_eos[10] = 2;
    cfg_case("cfg_model_type", "mistral", NULL, NULL, "{\"model_type\": \"mistral\"}", bos_hw, 10, NULL);
    cfg_case("cfg_stm", "mistral", "{\"add_eos_token\": true, \"eos_token\": \"<s>\"}",
             "{\"eos_token\": {\"content\": \"</s>\"}}", "{\"model_type\": \"llama\"}", bos_hw_eos, 11, NULL);
    cfg_case("cfg_neox", "mistral", "{\"bos_token\": \"<s>\"}", NULL,
             "{\"tokenizer_class\": \"GPTNeoXTokenizer\", \"model_type\": \"llama\"}", hw, 9, NULL);
    cfg_case("cfg_null_flag", "llama2",
             "{\"tokenizer_class\": \"LlamaTokenizer\", \"add_bos_token\": null, \"add_eos_token\": true}", NULL,
             NULL, hw_eos, 10, NULL);
    cfg_case("cfg_qwen2", "mistral", "{\"tokenizer_class\": \"Qwen2Tokenizer\", \"add_bos_token\": false}", NULL,
             NULL, bos_hw_eos, 11, NULL);
    cfg_case("cfg_no_config", "mistral", NULL, NULL, NULL, bos_hw_eos, 11, NULL);
    cfg_case("cfg_bad_flag", "mistral", "{\"tokenizer_class\": \"LlamaTokenizer\", \"add_eos_token\": \"yes\"}",
             NULL, NULL, NULL, -1, "tokenizer_config.json: field 'add_eos_token' must be true, false or null");
    cfg_case("cfg_null_bos", "mistral", "{\"tokenizer_class\": \"LlamaTokenizer\", \"bos_token\": null}", NULL,
             NULL, NULL, -1, "add_bos_token is true (given, or LlamaTokenizer's default) but bos_token is null");
    cfg_case("cfg_gemma", "mistral", "{\"tokenizer_class\": \"GemmaTokenizerFast\"}", NULL, NULL, NULL, -1,
             "bos_token is GemmaTokenizer's default \"<bos>\", which is not a token of tokenizer.json");
    cfg_case("cfg_unknown_eos", "mistral", "{\"tokenizer_class\": \"LlamaTokenizer\", \"add_eos_token\": true, "
             "\"eos_token\": \"<no-such-eos>\"}", NULL, NULL, NULL, -1,
             "tokenizer_config.json: field 'eos_token' (\"<no-such-eos>\") is not a token of tokenizer.json");
    cfg_case("cfg_bad_type", "mistral", "{\"tokenizer_class\": \"LlamaTokenizer\", \"eos_token\": 7, "
             "\"add_eos_token\": true}", NULL, NULL, NULL, -1, "field 'eos_token' must be a string or an object");
    cfg_case("cfg_bad_class", "mistral", "{\"tokenizer_class\": 5}", NULL, NULL, NULL, -1,
             "field 'tokenizer_class' must be a string");
    cfg_case("cfg_bad_json", "mistral", "{\"tokenizer_class\": ", NULL, NULL, NULL, -1,
             "tokenizer_config.json: not a JSON object");
}

int main(void) {
    size_t n;
    char *text = slurp(TWK_TOKENIZER_DIR "/expected.json", &n);
    cJSON *exp = text ? cJSON_Parse(text) : NULL;
    check(exp != NULL, "expected.json read (%s)", TWK_TOKENIZER_DIR);
    if (!exp) return 1;
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(exp, "library_version");
    printf("     references from tokenizers %s\n", cJSON_IsString(ver) ? ver->valuestring : "?");
    replay(exp, "bytelevel");
    replay(exp, "sp");
    replay(exp, "sp_legacy");
    replay(exp, "metaspace");
    raw_bytes();
    cJSON_Delete(exp);
    free(text);

    snprintf(tmpdir, sizeof tmpdir, "/tmp/twk_tokenizer_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    malformed();
    handmade();
    encode_cases();
    encode_corpus();
    config_cases();
    mutations();
    /* clean up the temporary folder */
    const char *names[] = {"empty.json",
                           "bad_json.json",
                           "top_array.json",
                           "no_model.json",
                           "wordpiece.json",
                           "unigram.json",
                           "untyped_model.json",
                           "dec_wordpiece.json",
                           "dec_ctc_in_seq.json",
                           "dec_regex.json",
                           "dec_strip_two_chars.json",
                           "dec_metaspace_norep.json",
                           "dec_metaspace_aps.json",
                           "version.json",
                           "id_negative.json",
                           "id_fraction.json",
                           "id_string.json",
                           "id_past_limit.json",
                           "id_sparse.json",
                           "id_twice.json",
                           "key_twice.json",
                           "added_bad_id.json",
                           "added_past_vocab.json",
                           "added_no_content.json",
                           "added_flag_type.json",
                           "added_lower.json",
                           "enc_regex.json",
                           "added_bert.json",
                           "nul_escape.json",
                           "not_utf8.json",
                           "holes.json",
                           "nodecoder.json",
                           "chain.json",
                           "meta_never.json",
                           "mutant.json"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", tmpdir, names[i]);
        unlink(p);
    }
    rmdir(tmpdir);
    printf("%s\n", check_failures ? "FAILED" : "all passed");
    return check_failures ? 1 : 0;
}
