/* safetensors: write/read round trips, bf16 and f16 conversion against exact
 * values, sharded folders through model.safetensors.index.json, and malformed
 * files (bad lengths, offsets past the end, bad JSON, unknown dtypes) refused
 * with a message naming the file and tensor. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../train/safetensors.h"
#include "twinkle/hal.h"

static int fails;

static void check(int cond, const char *what) {
    printf("%s %s%s%s\n", cond ? "ok  " : "FAIL", what, cond ? "" : " — ", cond ? "" : twk_last_error());
    fails += !cond;
}

/* Writes a raw safetensors file with one tensor: header JSON + data. */
static void write_raw(const char *path, const char *header, const void *data, size_t n, int64_t claimed_len) {
    FILE *f = fopen(path, "wb");
    uint64_t hl = claimed_len >= 0 ? (uint64_t)claimed_len : strlen(header);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(hl >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

/* f32 -> f16 / bf16 (twk_st_from_f32) against the decoder (twk_st_to_f32): every 16-bit pattern
 * round-trips; midpoints between neighbours round to the even one, just above / below to the
 * nearer one; past the largest finite value: infinity. Returns the number of mismatches. */
static int half_conversions(twk_st_dtype dt, const char *dname) {
    static uint16_t bits[65536], back[65536];
    static float f[65536];
    for (int i = 0; i < 65536; i++) bits[i] = (uint16_t)i;
    twk_st_tensor t = {.name = "x", .dtype = dt, .ndim = 1, .shape = {65536}, .nelem = 65536,
                       .data = (const unsigned char *)bits, .bytes = sizeof bits};
    snprintf(t.dtype_name, sizeof t.dtype_name, "%s", dname);
    int bad = 0, checked = 0;
    if (twk_st_to_f32(&t, f) != TWK_OK || twk_st_from_f32(dt, f, 65536, back) != TWK_OK) return 1 << 20;
    uint16_t exp_mask = dt == TWK_ST_F16 ? 0x7c00 : 0x7f80, inf = exp_mask;
    for (int i = 0; i < 65536; i++) {
        int nan = (i & exp_mask) == exp_mask && (i & ~exp_mask & 0x7fff);
        bad += nan ? !((back[i] & exp_mask) == exp_mask && (back[i] & ~exp_mask & 0x7fff)) : back[i] != i;
    }
    for (int h = 0; h + 1 < inf; h++) { /* neighbours h, h+1 among the positive finite values */
        float mid = (float)(((double)f[h] + (double)f[h + 1]) / 2), in[3] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY)};
        uint16_t out[3], even = (uint16_t)(h & 1 ? h + 1 : h);
        twk_st_from_f32(dt, in, 3, out);
        bad += out[0] != even || out[1] != h || out[2] != h + 1;
        checked++;
    }
    float big[2] = {dt == TWK_ST_F16 ? 65520.0f : FLT_MAX, -FLT_MAX};
    uint16_t ob[2];
    twk_st_from_f32(dt, big, 2, ob);
    bad += ob[0] != inf || ob[1] != (0x8000 | inf);
    printf("     %s: 65536 patterns round-tripped, %d midpoints checked, %d mismatches\n", dname, checked, bad);
    return bad;
}

int main(void) {
    char dir[] = "/tmp/twk_st_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char path[600];

    /* round trip */
    float a[6] = {1, -2, 3.5f, 0, 1e-8f, -1e8f};
    int32_t b[3] = {7, -1, 2147483647};
    int64_t c[2] = {-5, 1ll << 40};
    twk_st_entry e[3] = {
        {"w.a", TWK_ST_F32, 2, {2, 3}, a}, {"ids", TWK_ST_I32, 1, {3}, b}, {"big", TWK_ST_I64, 1, {2}, c}};
    const char *meta[2] = {"format", "pt"};
    snprintf(path, sizeof path, "%s/rt.safetensors", dir);
    check(twk_st_write(path, e, 3, meta, 1) == TWK_OK, "write f32/i32/i64 tensors atomically");
    twk_safetensors *st = NULL;
    check(twk_st_open(path, &st) == TWK_OK && twk_st_count(st) == 3, "read them back");
    const twk_st_tensor *ta = twk_st_find(st, "w.a");
    float got[6] = {0};
    check(ta && ta->ndim == 2 && ta->shape[1] == 3 && twk_st_to_f32(ta, got) == TWK_OK && !memcmp(got, a, sizeof a),
          "f32 values and shape survive");
    const twk_st_tensor *tb = twk_st_find(st, "ids"), *tc = twk_st_find(st, "big");
    check(tb && !memcmp(tb->data, b, sizeof b) && tc && !memcmp(tc->data, c, sizeof c), "i32 and i64 values survive");
    check(twk_st_to_f32(tb, got) == TWK_ERR_DTYPE && strstr(twk_last_error(), "ids"), "i32 is not read as float");
    twk_st_close(st);

    /* bf16 and f16: exact conversions */
    uint16_t bf[4] = {0x3f80, 0xc040, 0x0000, 0x7f80}; /* 1, -3, 0, +inf */
    uint16_t hf[5] = {0x3c00, 0xc500, 0x0001, 0x7bff, 0x8000}; /* 1, -5, 2^-24, 65504, -0 */
    snprintf(path, sizeof path, "%s/bf.safetensors", dir);
    write_raw(path, "{\"x\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]}}", bf, 8, -1);
    float fb[4];
    check(twk_st_open(path, &st) == TWK_OK && twk_st_to_f32(twk_st_find(st, "x"), fb) == TWK_OK && fb[0] == 1 &&
              fb[1] == -3 && fb[2] == 0 && isinf(fb[3]),
          "bf16 -> f32 exact");
    twk_st_close(st);
    snprintf(path, sizeof path, "%s/hf.safetensors", dir);
    write_raw(path, "{\"x\":{\"dtype\":\"F16\",\"shape\":[5],\"data_offsets\":[0,10]}}", hf, 10, -1);
    float fh[5];
    check(twk_st_open(path, &st) == TWK_OK && twk_st_to_f32(twk_st_find(st, "x"), fh) == TWK_OK && fh[0] == 1 &&
              fh[1] == -5 && fh[2] == ldexpf(1, -24) && fh[3] == 65504 && fh[4] == 0 && signbit(fh[4]),
          "f16 -> f32 exact, incl. subnormal and -0");
    twk_st_close(st);

    /* sharded folder */
    char shard_dir[256];
    snprintf(shard_dir, sizeof shard_dir, "%s/sharded", dir);
    mkdir(shard_dir, 0755);
    twk_st_entry s1 = {"layer.0", TWK_ST_F32, 1, {2}, a}, s2 = {"layer.1", TWK_ST_F32, 1, {3}, a + 2};
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", shard_dir);
    twk_st_write(path, &s1, 1, NULL, 0);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", shard_dir);
    twk_st_write(path, &s2, 1, NULL, 0);
    const char *idx = "{\"metadata\":{},\"weight_map\":{\"layer.0\":\"model-00001-of-00002.safetensors\","
                      "\"layer.1\":\"model-00002-of-00002.safetensors\"}}";
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", shard_dir);
    twk_write_file_atomic(path, idx, strlen(idx));
    check(twk_st_open(shard_dir, &st) == TWK_OK && twk_st_count(st) == 2 && twk_st_find(st, "layer.1") &&
              ((const float *)twk_st_find(st, "layer.1")->data)[2] == a[4],
          "a sharded folder opens through its index");
    twk_st_close(st);

    /* malformed files */
    struct { const char *name, *header, *needle; int64_t claimed; size_t data; } bad[] = {
        {"length past the end", "{}", "header length", 1000, 0},
        {"bad json", "{\"x\":", "not a JSON object", -1, 0},
        {"offsets past the data", "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", "'x' offsets", -1, 8},
        {"shape disagrees with offsets", "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", "'x' offsets", -1, 8},
        {"unknown dtype", "{\"x\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", "unknown dtype Q4", -1, 8},
        {"missing shape", "{\"x\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", "malformed", -1, 8},
        /* found by tests/fuzz: the element count overflowed int64 (UBSan) */
        {"element count past int64", "{\"x\":{\"dtype\":\"I64\",\"shape\":[18446744073,7095516151],\"data_offsets\":[0,8]}}",
         "'x' offsets", -1, 8},
        {"zero dim beside huge ones", "{\"x\":{\"dtype\":\"F32\",\"shape\":[1000000000000,1000000000000,0],\"data_offsets\":[0,8]}}",
         "'x' offsets", -1, 8},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "%s/bad%zu.safetensors", dir, i);
        write_raw(path, bad[i].header, a, bad[i].data, bad[i].claimed);
        twk_status s = twk_st_open(path, &st);
        char what[128];
        snprintf(what, sizeof what, "refused: %s", bad[i].name);
        int ok = s != TWK_OK && st == NULL && strstr(twk_last_error(), bad[i].needle) && strstr(twk_last_error(), path);
        check(ok, what);
        if (ok) printf("     %s\n", twk_last_error());
    }
    check(twk_st_open("/nonexistent/x.safetensors", &st) == TWK_ERR_IO, "a missing file is an io error");

    /* f16 / bf16: conversion from f32 and writing */
    check(half_conversions(TWK_ST_F16, "F16") == 0, "f32 -> f16 rounds to nearest even (all patterns, all midpoints)");
    check(half_conversions(TWK_ST_BF16, "BF16") == 0, "f32 -> bf16 rounds to nearest even (all patterns, all midpoints)");
    {
        float v[3] = {1.5f, -0.333333f, 1000.25f}, r[3];
        uint16_t hv[3], bv[3];
        twk_st_from_f32(TWK_ST_F16, v, 3, hv);
        twk_st_from_f32(TWK_ST_BF16, v, 3, bv);
        twk_st_entry ent[2] = {{"h", TWK_ST_F16, 1, {3}, hv}, {"b", TWK_ST_BF16, 1, {3}, bv}};
        snprintf(path, sizeof path, "%s/half.safetensors", dir);
        int ok = twk_st_write(path, ent, 2, NULL, 0) == TWK_OK && twk_st_open(path, &st) == TWK_OK;
        ok = ok && twk_st_find(st, "h")->dtype == TWK_ST_F16 && twk_st_find(st, "b")->dtype == TWK_ST_BF16;
        ok = ok && twk_st_to_f32(twk_st_find(st, "h"), r) == TWK_OK && r[0] == 1.5f && fabsf(r[1] + 0.333333f) < 2e-4f;
        ok = ok && twk_st_to_f32(twk_st_find(st, "b"), r) == TWK_OK && r[2] == 1000.0f;
        if (st) twk_st_close(st);
        check(ok, "F16 / BF16 tensors are written and read back");
    }
    printf("%d failures\n", fails);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fails++;
    return fails ? 1 : 0;
}
