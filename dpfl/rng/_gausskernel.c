/* dpfl.rng.gauss (the ziggurat) on the CPU: the same values as the torch code, op for op.
 *
 * fast(words, out, std, wt, kt, rej_idx, rej_words, base) -> count: for each int64 word w, layer
 * i = w & 255, j = (w >> 10) | 1, out = (double)j * wt[i] * std rounded to out's type (float32 or
 * float64); the words with |j| >= kt[i] go, in order, to rej_words and their indices + base to
 * rej_idx (both int64, room for n).
 * slow(cand, idx, words, std, wt, kt, fx, out) -> open: one pass of gauss.resolve over the open
 * candidates, 3 words each; resolved ones are written to out[idx[e]], the still-open ones packed in
 * order at the front of cand and idx.
 *
 * Integer work and IEEE float64 + - * / only, built with -ffp-contract=off (no fused multiply-add),
 * so vector and scalar code give the same bits: x86-64 CPUs with AVX-512 or AVX2 take vector loops
 * (chosen at run time), others the plain C ones. isa() names the path in use: the widest this CPU
 * has, under the cap limit(level) sets (0 plain C, 1 AVX2, 2 AVX-512; it returns the cap before),
 * so that tests and `dpfl bench noise` can run each. Runs with the GIL released: a call reads the
 * cap once.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define X86 1
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw")))
#define AVX2 __attribute__((target("avx2")))
static int isa_cpu(void) {
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")
        && __builtin_cpu_supports("avx512bw"))
        return 2;
    return __builtin_cpu_supports("avx2") ? 1 : 0;
}
#else
static int isa_cpu(void) { return 0; }
#endif
static int isa_cap = 2; /* limit() */
static int isa_level(void) {
    int cap = __atomic_load_n(&isa_cap, __ATOMIC_RELAXED), cpu = isa_cpu();
    return cpu < cap ? cpu : cap;
}

static inline double bits2d(int64_t b) { double d; memcpy(&d, &b, 8); return d; }
static inline int64_t d2bits(double d) { int64_t b; memcpy(&b, &d, 8); return b; }

static int get(PyObject *o, Py_buffer *b, int writable) {
    return PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0));
}

/* ---- fast path ---- */

/* Portable: values and a reject flag per word, then the flags scanned for the rejected words. */
#define VALUES(NAME, T, ATTR)                                                                       \
    ATTR static void NAME(const int64_t *restrict ws, T *restrict out, uint8_t *restrict flag, Py_ssize_t n, double std, \
                          const double *restrict wtab, const int64_t *restrict ktab) {                \
        for (Py_ssize_t e = 0; e < n; e++) {                                                        \
            int64_t x = ws[e];                                                                      \
            int64_t i = x & 255;                                                                    \
            int64_t j = (x >> 10) | 1;                                                              \
            out[e] = (T)(((double)j * wtab[i]) * std);                                              \
            flag[e] = (j < 0 ? -j : j) >= ktab[i];                                                  \
        }                                                                                           \
    }

VALUES(values_f32, float, inline)
VALUES(values_f64, double, inline)

static Py_ssize_t fast_portable(int f32, const int64_t *ws, void *out, Py_ssize_t n, double std, const double *wt,
                                const int64_t *kt, int64_t *ri, int64_t *rw, int64_t base) {
    uint8_t flag[4096];
    Py_ssize_t m = 0;
    for (Py_ssize_t s = 0; s < n; s += 4096) {
        Py_ssize_t k = n - s < 4096 ? n - s : 4096;
        const int64_t *w = ws + s;
        if (f32) values_f32(w, (float *)out + s, flag, k, std, wt, kt);
        else values_f64(w, (double *)out + s, flag, k, std, wt, kt);
        for (Py_ssize_t e = 0; e < k; e++)
            if (flag[e]) { ri[m] = base + s + e; rw[m++] = w[e]; }
    }
    return m;
}

#ifdef X86
/* The flagged words of a 4096-word block (bits: one per word, from word b), checked against kt
 * exactly; the rejected ones appended, in order, at ri/rw[m...]. Returns the new m. */
static Py_ssize_t scan(const uint64_t *bits, Py_ssize_t nq, const int64_t *ws, Py_ssize_t b, const int64_t *kt,
                       int64_t *ri, int64_t *rw, Py_ssize_t m, int64_t base) {
    for (Py_ssize_t q = 0; q < nq; q++)
        for (uint64_t r = bits[q]; r; r &= r - 1) {
            Py_ssize_t e = b + 64 * q + __builtin_ctzll(r);
            int64_t w = ws[e], j = (w >> 10) | 1;
            if ((j < 0 ? -j : j) >= kt[w & 255]) {
                ri[m] = base + e;
                rw[m++] = w;
            }
        }
    return m;
}

/* AVX-512: 8 words at a time, one table gather for the 8: entry i holds wt[i] with its exponent
 * rebased into 3 bits (bits 0-54) and, above, kt[i] >> 44 (a 9-bit floor of the reject bound):
 * (|j| >> 44) < that is a sure accept. The others (about 1.7 %) go to a bitmap, no branch in the
 * loop, which is then scanned, in blocks of 4096 words, against kt exactly. */
#define LOW55 ((INT64_C(1) << 55) - 1)
static int pack_tables(const double *wt, const int64_t *kt, int64_t *pk, int64_t *e0) {
    int64_t lo = INT64_MAX;
    for (int i = 0; i < 256; i++) lo = d2bits(wt[i]) >> 52 < lo ? d2bits(wt[i]) >> 52 : lo;
    for (int i = 0; i < 256; i++) {
        int64_t b = d2bits(wt[i]);
        if (lo < 1 || (b >> 52) - lo > 7 || kt[i] < 0 || kt[i] >= INT64_C(1) << 53) return 0;
        pk[i] = (kt[i] >> 44) << 55 | (b - (lo << 52));
    }
    *e0 = lo << 52;
    return 1;
}

AVX512 static Py_ssize_t fast_avx512(int f32, const int64_t *ws, void *out, Py_ssize_t n, double std,
                                     const int64_t *pk, int64_t e0, const int64_t *kt, int64_t *ri, int64_t *rw,
                                     int64_t base) {
    const __m512d s = _mm512_set1_pd(std);
    const __m512i low8 = _mm512_set1_epi64(255), one = _mm512_set1_epi64(1);
    const __m512i low55 = _mm512_set1_epi64(LOW55), expo = _mm512_set1_epi64(e0);
    uint64_t bits[4096 / 64];
    Py_ssize_t m = 0;
    for (Py_ssize_t b = 0; b < n; b += 4096) {
        Py_ssize_t k = n - b < 4096 ? n - b : 4096;
        bits[(k - 1) >> 6] = 0; /* the last word may be filled only in part */
        for (Py_ssize_t e = b; e < b + k; e += 8) {
            __mmask8 live = b + k - e >= 8 ? 0xFF : (__mmask8)((1u << (b + k - e)) - 1);
            __m512i w = _mm512_maskz_loadu_epi64(live, ws + e);
            __m512i j = _mm512_or_si512(_mm512_srai_epi64(w, 10), one);
            __m512i p = _mm512_i64gather_epi64(_mm512_and_si512(w, low8), pk, 8);
            __m512d wv = _mm512_castsi512_pd(_mm512_add_epi64(_mm512_and_si512(p, low55), expo));
            __m512d v = _mm512_mul_pd(_mm512_mul_pd(_mm512_cvtepi64_pd(j), wv), s);
            if (f32) _mm256_mask_storeu_ps((float *)out + e, live, _mm512_cvtpd_ps(v));
            else _mm512_mask_storeu_pd((double *)out + e, live, v);
            __m512i top = _mm512_or_si512(_mm512_slli_epi64(_mm512_abs_epi64(j), 11), low55); /* |j| >> 44, at 55 */
            ((uint8_t *)bits)[(e - b) >> 3] = live & _mm512_cmpge_epu64_mask(top, p);
        }
        m = scan(bits, (k + 63) >> 6, ws, b, kt, ri, rw, m, base);
    }
    return m;
}

/* AVX2: the AVX-512 loop 4 words at a time, with what AVX2 lacks written out: the arithmetic
 * shift ((x >>> n) ^ s) - s, s = 2^(63-n); j (|j| < 2^53) to double exactly as hi·2^32 + lo, each
 * part placed in a double's mantissa by its bits and the two added (the sum is exact); |j| by its
 * sign mask; and the sure-accept test on the 9-bit floors, small enough for a signed compare. */
AVX2 static inline __m256i sra64(__m256i x, int n, __m256i s) {
    return _mm256_sub_epi64(_mm256_xor_si256(_mm256_srli_epi64(x, n), s), s);
}

/* (double)v, exact, for v = hi·2^32 + lo with -2^21 <= hi < 2^21 (hi given, signed), lo = v's low 32 bits */
AVX2 static inline __m256d to_double(__m256i hi, __m256i v) {
    const __m256i b52 = _mm256_set1_epi64x(INT64_C(0x4330000000000000)); /* 2^52: ulp 1 */
    const __m256i b84 = _mm256_set1_epi64x(INT64_C(0x4538000000000000)); /* 3·2^83: ulp 2^32 */
    __m256d h = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_add_epi64(b84, hi)), _mm256_castsi256_pd(b84));
    __m256i low = _mm256_and_si256(v, _mm256_set1_epi64x(0xFFFFFFFF));
    return _mm256_add_pd(h, _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(low, b52)), _mm256_castsi256_pd(b52)));
}

/* (double)j for j = (w >> 10) | 1 */
AVX2 static inline __m256d j_double(__m256i w, __m256i j) {
    return to_double(sra64(w, 42, _mm256_set1_epi64x(INT64_C(1) << 21)), j);
}

AVX2 static Py_ssize_t fast_avx2(int f32, const int64_t *ws, void *out, Py_ssize_t n, double std,
                                   const double *wt, const int64_t *pk, int64_t e0, const int64_t *kt, int64_t *ri,
                                   int64_t *rw, int64_t base) {
    const __m256d s = _mm256_set1_pd(std);
    const __m256i one = _mm256_set1_epi64x(1), zero = _mm256_setzero_si256();
    const __m256i low55 = _mm256_set1_epi64x(LOW55), expo = _mm256_set1_epi64x(e0);
    const __m256i s10 = _mm256_set1_epi64x(INT64_C(1) << 53);
    uint64_t bits[4096 / 64];
    Py_ssize_t m = 0;
    for (Py_ssize_t b = 0; b < n; b += 4096) {
        Py_ssize_t k = n - b < 4096 ? n - b : 4096, k4 = k & ~(Py_ssize_t)3;
        memset(bits, 0, sizeof bits);
        for (Py_ssize_t e = b; e < b + k4; e += 4) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(ws + e));
            __m256i j = _mm256_or_si256(sra64(w, 10, s10), one);
            __m256i p = _mm256_set_epi64x(pk[ws[e + 3] & 255], pk[ws[e + 2] & 255], pk[ws[e + 1] & 255], pk[ws[e] & 255]);
            __m256d wv = _mm256_castsi256_pd(_mm256_add_epi64(_mm256_and_si256(p, low55), expo));
            __m256d v = _mm256_mul_pd(_mm256_mul_pd(j_double(w, j), wv), s);
            if (f32) _mm_storeu_ps((float *)out + e, _mm256_cvtpd_ps(v));
            else _mm256_storeu_pd((double *)out + e, v);
            __m256i neg = _mm256_cmpgt_epi64(zero, j);
            __m256i top = _mm256_srli_epi64(_mm256_sub_epi64(_mm256_xor_si256(j, neg), neg), 44);
            __m256i sure = _mm256_cmpgt_epi64(_mm256_srli_epi64(p, 55), top);
            int r = ~_mm256_movemask_pd(_mm256_castsi256_pd(sure)) & 15;
            ((uint8_t *)bits)[(e - b) >> 3] |= (uint8_t)(r << ((e - b) & 4));
        }
        m = scan(bits, (k4 + 63) >> 6, ws, b, kt, ri, rw, m, base);
        if (k4 < k) /* the last 1-3 words */
            m += fast_portable(f32, ws + b + k4, f32 ? (void *)((float *)out + b + k4) : (void *)((double *)out + b + k4),
                               k - k4, std, wt, kt, ri + m, rw + m, base + b + k4);
    }
    return m;
}
#endif

static PyObject *fast(PyObject *self, PyObject *args) {
    PyObject *ob[6];
    double std;
    long long base;
    if (!PyArg_ParseTuple(args, "OOdOOOOL", &ob[0], &ob[1], &std, &ob[2], &ob[3], &ob[4], &ob[5], &base)) return NULL;
    static const int wr[6] = {0, 1, 0, 0, 1, 1};
    Py_buffer b[6];
    int got = 0;
    PyObject *res = NULL;
    for (; got < 6; got++)
        if (get(ob[got], &b[got], wr[got])) goto done;
    Py_ssize_t n = b[0].len / 8, isz = b[1].itemsize;
    if (b[0].itemsize != 8 || (isz != 4 && isz != 8) || b[1].len / isz != n || b[2].len != 256 * 8
        || b[3].len != 256 * 8 || b[4].len / 8 < n || b[5].len / 8 < n) {
        PyErr_SetString(PyExc_ValueError, "gausskernel.fast: bad buffer sizes");
        goto done;
    }
    const int64_t *ws = b[0].buf, *kt = b[3].buf;
    const double *wt = b[2].buf;
    int64_t *ri = b[4].buf, *rw = b[5].buf;
    Py_ssize_t m;
    Py_BEGIN_ALLOW_THREADS
#ifdef X86
    int64_t pk[256], e0;
    int level = isa_level();
    if (level && !pack_tables(wt, kt, pk, &e0)) level = 0;
    if (level == 2) m = fast_avx512(isz == 4, ws, b[1].buf, n, std, pk, e0, kt, ri, rw, base);
    else if (level == 1) m = fast_avx2(isz == 4, ws, b[1].buf, n, std, wt, pk, e0, kt, ri, rw, base);
    else
#endif
    m = fast_portable(isz == 4, ws, b[1].buf, n, std, wt, kt, ri, rw, base);
    Py_END_ALLOW_THREADS
    res = PyLong_FromSsize_t(m);
done:
    for (int q = 0; q < got; q++) PyBuffer_Release(&b[q]);
    return res;
}

/* ---- slow path: one pass over the open candidates ---- */

static inline double uniform(int64_t w) { return ((double)((w >> 11) & ((INT64_C(1) << 53) - 1)) + 0.5) * 0x1p-53; }

static double zlog(double u) {
    int64_t b = d2bits(u);
    int64_t e = (b >> 52) - 1023;
    double m = bits2d((b & INT64_C(0x000FFFFFFFFFFFFF)) | INT64_C(0x3FF0000000000000));
    if (m > 1.4142135623730951) { m = m * 0.5; e = e + 1; }
    double ef = (double)e;
    double s = (m - 1.0) / (m + 1.0);
    double z = s * s;
    double p = 1.0 / 23;
    for (int k = 21; k > 0; k -= 2) { p = p * z; p = p + 1.0 / k; }
    double r = ef * 1.90821492927058770002e-10;
    r = r + p * (s + s);
    return r + ef * 6.93147180369123816490e-01;
}

static double inv_fact[15]; /* 1.0 / j!, j! exact in a double (< 2^53): set at import */

static inline double zexp_neg(double t) {
    double k = (double)(int64_t)(t * 1.4426950408889634 + 0.5); /* floor (the sum is >= 0.5): vectorizes */
    double y = k * 6.93147180369123816490e-01;
    y = y - t;
    y = y + k * 1.90821492927058770002e-10;
    double p = inv_fact[14];
    for (int j = 13; j >= 0; j--) { p = p * y; p = p + inv_fact[j]; }
    return p * bits2d((1023 - (int64_t)k) << 52);
}

/* A fresh candidate from word w: its x, and whether the fast path takes it. */
static inline int fresh(int64_t w, const double *wt, const int64_t *kt, double *x) {
    int64_t i = w & 255, j = (w >> 10) | 1;
    *x = (double)j * wt[i];
    return (j < 0 ? -j : j) < kt[i];
}

/* The pass for layers 1..255 (the wedge test, else the fresh candidate) for every candidate:
 * branch-free, so it vectorizes; val = the value times std where done. Layer 0 is redone below. */
#define PASS(NAME, ATTR)                                                                            \
    ATTR static void NAME(const int64_t *restrict c, const int64_t *restrict ew, Py_ssize_t m, double std, \
                          const double *restrict wt, const int64_t *restrict kt, const double *restrict fx, \
                          double *restrict val, uint8_t *restrict done) {                           \
        for (Py_ssize_t e = 0; e < m; e++) {                                                        \
            int64_t i = c[e] & 255, j = (c[e] >> 10) | 1;                                           \
            double x = (double)j * wt[i], x2;                                                       \
            double lo = fx[i];                                                                      \
            double h = (fx[i + 1] - lo) * uniform(ew[3 * e]);                                       \
            int good = h + lo < zexp_neg((x * x) * 0.5);                                            \
            int ok2 = fresh(ew[3 * e + 2], wt, kt, &x2);                                            \
            int64_t pick = -(int64_t)good; /* x or x2, by bit masks */                             \
            val[e] = bits2d((d2bits(x) & pick) | (d2bits(x2) & ~pick)) * std;                       \
            done[e] = good | ok2;                                                                   \
        }                                                                                           \
    }

PASS(pass_plain, inline)

#ifdef X86
PASS(pass_v4, AVX512)

/* AVX2: PASS written out 4 candidates at a time (gcc does not vectorize its int64 -> double), with
 * the fast path's exact conversions; trunc of a positive double for the (int64_t) cast in zexp_neg. */
AVX2 static inline __m256i load4(const int64_t *p, Py_ssize_t stride) {
    return _mm256_set_epi64x(p[3 * stride], p[2 * stride], p[stride], p[0]);
}

AVX2 static inline __m256d table4(const double *t, __m256i i) {
    int64_t k[4];
    _mm256_storeu_si256((__m256i *)k, i);
    return _mm256_set_pd(t[k[3]], t[k[2]], t[k[1]], t[k[0]]);
}

AVX2 static inline __m256d uniform4(__m256i w) {
    __m256i v = _mm256_and_si256(_mm256_srli_epi64(w, 11), _mm256_set1_epi64x((INT64_C(1) << 53) - 1));
    __m256d d = to_double(_mm256_srli_epi64(v, 32), v);
    return _mm256_mul_pd(_mm256_add_pd(d, _mm256_set1_pd(0.5)), _mm256_set1_pd(0x1p-53));
}

AVX2 static inline __m256d exp_neg4(__m256d t) {
    __m256d k = _mm256_round_pd(_mm256_add_pd(_mm256_mul_pd(t, _mm256_set1_pd(1.4426950408889634)), _mm256_set1_pd(0.5)),
                                _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256d y = _mm256_mul_pd(k, _mm256_set1_pd(6.93147180369123816490e-01));
    y = _mm256_sub_pd(y, t);
    y = _mm256_add_pd(y, _mm256_mul_pd(k, _mm256_set1_pd(1.90821492927058770002e-10)));
    __m256d p = _mm256_set1_pd(inv_fact[14]);
    for (int j = 13; j >= 0; j--) p = _mm256_add_pd(_mm256_mul_pd(p, y), _mm256_set1_pd(inv_fact[j]));
    const __m256d b52 = _mm256_set1_pd(0x1p52); /* k < 2^52: its integer in the mantissa */
    __m256i ki = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(k, b52)), _mm256_castpd_si256(b52));
    __m256i sc = _mm256_slli_epi64(_mm256_sub_epi64(_mm256_set1_epi64x(1023), ki), 52);
    return _mm256_mul_pd(p, _mm256_castsi256_pd(sc));
}

AVX2 static void pass_v3(const int64_t *restrict c, const int64_t *restrict ew, Py_ssize_t m, double std,
                         const double *restrict wt, const int64_t *restrict kt, const double *restrict fx,
                         double *restrict val, uint8_t *restrict done) {
    const __m256i low8 = _mm256_set1_epi64x(255), one = _mm256_set1_epi64x(1), zero = _mm256_setzero_si256();
    const __m256i s10 = _mm256_set1_epi64x(INT64_C(1) << 53);
    Py_ssize_t m4 = m & ~(Py_ssize_t)3;
    for (Py_ssize_t e = 0; e < m4; e += 4) {
        __m256i w = _mm256_loadu_si256((const __m256i *)(c + e));
        __m256i i = _mm256_and_si256(w, low8);
        __m256d x = _mm256_mul_pd(j_double(w, _mm256_or_si256(sra64(w, 10, s10), one)), table4(wt, i));
        __m256d lo = table4(fx, i), hi = table4(fx + 1, i);
        __m256d h = _mm256_mul_pd(_mm256_sub_pd(hi, lo), uniform4(load4(ew + 3 * e, 3)));
        __m256d good = _mm256_cmp_pd(_mm256_add_pd(h, lo), exp_neg4(_mm256_mul_pd(_mm256_mul_pd(x, x), _mm256_set1_pd(0.5))),
                                     _CMP_LT_OQ);
        __m256i w2 = load4(ew + 3 * e + 2, 3), i2 = _mm256_and_si256(w2, low8);
        __m256i j2 = _mm256_or_si256(sra64(w2, 10, s10), one);
        __m256d x2 = _mm256_mul_pd(j_double(w2, j2), table4(wt, i2));
        int64_t kk[4], i2s[4];
        _mm256_storeu_si256((__m256i *)i2s, i2);
        for (int l = 0; l < 4; l++) kk[l] = kt[i2s[l]];
        __m256i neg = _mm256_cmpgt_epi64(zero, j2);
        __m256i ok2 = _mm256_cmpgt_epi64(_mm256_loadu_si256((const __m256i *)kk),
                                         _mm256_sub_epi64(_mm256_xor_si256(j2, neg), neg));
        _mm256_storeu_pd(val + e, _mm256_mul_pd(_mm256_blendv_pd(x2, x, good), _mm256_set1_pd(std)));
        int d = _mm256_movemask_pd(_mm256_or_pd(good, _mm256_castsi256_pd(ok2)));
        for (int l = 0; l < 4; l++) done[e + l] = (d >> l) & 1;
    }
    pass_plain(c + m4, ew + 3 * m4, m - m4, std, wt, kt, fx, val + m4, done + m4);
}
#endif

static Py_ssize_t slow_pass(int f32, int64_t *c, int64_t *idx, const int64_t *ew, Py_ssize_t m, double std,
                            const double *wt, const int64_t *kt, const double *fx, void *out, double *val,
                            uint8_t *done) {
#ifdef X86
    int level = isa_level();
    if (level == 2) pass_v4(c, ew, m, std, wt, kt, fx, val, done);
    else if (level == 1) pass_v3(c, ew, m, std, wt, kt, fx, val, done);
    else
#endif
    pass_plain(c, ew, m, std, wt, kt, fx, val, done);
    Py_ssize_t open = 0;
    char *o = out;
    int sz = f32 ? 4 : 8;
    for (Py_ssize_t e = 0; e < m; e++) {
        if (e + 32 < m) __builtin_prefetch(o + sz * idx[e + 32], 1); /* out is out of cache by now */
        double v = val[e];
        int d = done[e];
        if ((c[e] & 255) == 0) { /* layer 0: the tail beyond r */
            int64_t j = (c[e] >> 10) | 1;
            double xt = -zlog(uniform(ew[3 * e])) * 0.2736612373297583; /* gauss.INV_R */
            int good = (-zlog(uniform(ew[3 * e + 1]))) * 2.0 > xt * xt;
            double x = j < 0 ? -(xt + 3.6541528853610088) : xt + 3.6541528853610088, x2;
            d = fresh(ew[3 * e + 2], wt, kt, &x2) | good;
            v = (good ? x : x2) * std;
        }
        if (d) {
            if (f32) ((float *)out)[idx[e]] = (float)v;
            else ((double *)out)[idx[e]] = v;
        } else {
            c[open] = ew[3 * e + 2];
            idx[open++] = idx[e];
        }
    }
    return open;
}

static PyObject *slow(PyObject *self, PyObject *args) {
    PyObject *ob[7];
    double std;
    if (!PyArg_ParseTuple(args, "OOOdOOOO", &ob[0], &ob[1], &ob[2], &std, &ob[3], &ob[4], &ob[5], &ob[6])) return NULL;
    static const int wr[7] = {1, 1, 0, 0, 0, 0, 1};
    Py_buffer b[7];
    int got = 0;
    PyObject *res = NULL;
    for (; got < 7; got++)
        if (get(ob[got], &b[got], wr[got])) goto done;
    Py_ssize_t m = b[0].len / 8, isz = b[6].itemsize, nout = b[6].len / (isz ? isz : 1);
    if (b[0].itemsize != 8 || b[1].len != 8 * m || b[2].len != 24 * m || b[3].len != 256 * 8
        || b[4].len != 256 * 8 || b[5].len != 257 * 8 || (isz != 4 && isz != 8)) {
        PyErr_SetString(PyExc_ValueError, "gausskernel.slow: bad buffer sizes");
        goto done;
    }
    int64_t *idx = b[1].buf;
    for (Py_ssize_t e = 0; e < m; e++)
        if (idx[e] < 0 || idx[e] >= nout) {
            PyErr_SetString(PyExc_IndexError, "gausskernel.slow: index out of range");
            goto done;
        }
    double *val = PyMem_RawMalloc(9 * m + 1); /* scratch: m values, then m done flags */
    if (!val) { PyErr_NoMemory(); goto done; }
    Py_ssize_t open;
    Py_BEGIN_ALLOW_THREADS
    open = slow_pass(isz == 4, b[0].buf, idx, b[2].buf, m, std, b[3].buf, b[4].buf, b[5].buf, b[6].buf, val,
                     (uint8_t *)(val + m));
    Py_END_ALLOW_THREADS
    PyMem_RawFree(val);
    res = PyLong_FromSsize_t(open);
done:
    for (int q = 0; q < got; q++) PyBuffer_Release(&b[q]);
    return res;
}

/* ---- the discrete-Gaussian table sampler's lookup (dpfl.privacy.samplers._Table.lookup) ----
 *
 * dg_lookup(words, lut, thr, lo, hi, K, L, out, ex_idx, ex_words, base) -> count: for each uint32
 * word w, cell h = w >> L, v = lut[h]; a cell holding a boundary (v < -K: SINGLE = INT32_MIN + 1 or
 * MULTI = INT32_MIN) gives lo[h] if the word's low L bits are below thr[h], else hi[h], and is
 * exact-checked later when it is MULTI or equal to thr[h]: those words go, in order, to ex_words
 * and their indices + base to ex_idx. out (int64) gets v. Integer work only. */
static PyObject *dg_lookup(PyObject *self, PyObject *args) {
    PyObject *ob[8];
    long long K, base;
    int L;
    if (!PyArg_ParseTuple(args, "OOOOOLiOOOL", &ob[0], &ob[1], &ob[2], &ob[3], &ob[4], &K, &L, &ob[5], &ob[6],
                          &ob[7], &base))
        return NULL;
    static const int wr[8] = {0, 0, 0, 0, 0, 1, 1, 1};
    static const int isz[8] = {4, 4, 4, 4, 4, 8, 8, 4};
    Py_buffer b[8];
    int got = 0;
    PyObject *res = NULL;
    for (; got < 8; got++)
        if (get(ob[got], &b[got], wr[got])) goto done;
    static const char *kinds[8] = {"I", "i", "I", "i", "i", "lq", "lq", "I"}; /* uint32, int32, int64 */
    for (int q = 0; q < 8; q++) {
        const char *f = b[q].format ? b[q].format : "B";
        if (*f == '<' || *f == '=' || *f == '@') f++;
        if (b[q].itemsize != isz[q] || strlen(f) != 1 || !strchr(kinds[q], *f)) {
            PyErr_SetString(PyExc_ValueError, "gausskernel.dg_lookup: bad item types");
            goto done;
        }
    }
    Py_ssize_t n = b[0].len / 4, cells = b[1].len / 4;
    if (L < 0 || L > 31 || cells != ((Py_ssize_t)1 << (32 - L)) || b[2].len != b[1].len || b[3].len != b[1].len
        || b[4].len != b[1].len || b[5].len / 8 != n || b[6].len / 8 < n || b[7].len / 4 < n || K < 0
        || K > (INT64_C(1) << 30)) { /* K far from the INT32_MIN markers */
        PyErr_SetString(PyExc_ValueError, "gausskernel.dg_lookup: bad buffer sizes");
        goto done;
    }
    const uint32_t *w = b[0].buf, *thr = b[2].buf;
    const int32_t *lut = b[1].buf, *lo = b[3].buf, *hi = b[4].buf;
    int64_t *out = b[5].buf, *ri = b[6].buf;
    uint32_t *rw = b[7].buf;
    const uint32_t low = L ? (uint32_t)((UINT64_C(1) << L) - 1) : 0;
    Py_ssize_t m = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t e = 0; e < n; e++) {
        uint32_t x = w[e], h = L < 32 ? x >> L : 0;
        int32_t v = lut[h];
        if (v < -K) { /* a boundary in the cell */
            uint32_t ul = x & low, t = thr[h];
            int multi = v == INT32_MIN;
            v = ul < t ? lo[h] : hi[h];
            if (multi || ul == t) {
                ri[m] = base + e;
                rw[m++] = x;
            }
        }
        out[e] = v;
    }
    Py_END_ALLOW_THREADS
    res = PyLong_FromSsize_t(m);
done:
    for (int q = 0; q < got; q++) PyBuffer_Release(&b[q]);
    return res;
}

static const char *isa_names[3] = {"plain", "avx2", "avx512"};

static PyObject *isa(PyObject *self, PyObject *args) { return PyUnicode_FromString(isa_names[isa_level()]); }

static PyObject *limit(PyObject *self, PyObject *args) {
    int level;
    if (!PyArg_ParseTuple(args, "i", &level)) return NULL;
    if (level < 0 || level > 2) {
        PyErr_SetString(PyExc_ValueError, "gausskernel.limit: level must be 0 (plain C), 1 (AVX2) or 2 (AVX-512)");
        return NULL;
    }
    return PyLong_FromLong(__atomic_exchange_n(&isa_cap, level, __ATOMIC_RELAXED));
}

static PyMethodDef methods[] = {
    {"fast", fast, METH_VARARGS, "ziggurat fast path: values, and the rejected words and their indices"},
    {"slow", slow, METH_VARARGS, "one pass of the ziggurat's slow path, into out"},
    {"dg_lookup", dg_lookup, METH_VARARGS, "the discrete-Gaussian table sampler's lookup; returns the exact cases' count"},
    {"isa", isa, METH_NOARGS, "the vector instructions the kernel uses: plain, avx2 or avx512"},
    {"limit", limit, METH_VARARGS, "cap the vector instructions (0 plain C, 1 AVX2, 2 AVX-512); returns the cap before"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gausskernel", NULL, -1, methods};

PyMODINIT_FUNC PyInit__gausskernel(void) {
    double f = 1.0;
    for (int j = 0; j < 15; j++) {
        if (j) f = f * j;
        inv_fact[j] = 1.0 / f;
    }
    return PyModule_Create(&module);
}
