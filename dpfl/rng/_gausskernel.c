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
 * so vector and scalar code give the same bits: x86-64 CPUs with AVX-512 take the vector loops
 * (chosen at run time), others the plain C ones. Runs with the GIL released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define X86 1
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw")))
static int has_avx512(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")
        && __builtin_cpu_supports("avx512bw");
}
#endif

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
        for (Py_ssize_t q = 0; q <= (k - 1) >> 6; q++)
            for (uint64_t r = bits[q]; r; r &= r - 1) {
                Py_ssize_t e = b + 64 * q + __builtin_ctzll(r);
                int64_t w = ws[e], j = (w >> 10) | 1;
                if ((j < 0 ? -j : j) >= kt[w & 255]) {
                    ri[m] = base + e;
                    rw[m++] = w;
                }
            }
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
    if (has_avx512() && pack_tables(wt, kt, pk, &e0)) m = fast_avx512(isz == 4, ws, b[1].buf, n, std, pk, e0, kt, ri, rw, base);
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

#ifdef X86
PASS(pass_v4, AVX512)
#endif
PASS(pass_plain, inline)

static Py_ssize_t slow_pass(int f32, int64_t *c, int64_t *idx, const int64_t *ew, Py_ssize_t m, double std,
                            const double *wt, const int64_t *kt, const double *fx, void *out, double *val,
                            uint8_t *done) {
#ifdef X86
    if (has_avx512()) pass_v4(c, ew, m, std, wt, kt, fx, val, done);
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

static PyMethodDef methods[] = {
    {"fast", fast, METH_VARARGS, "ziggurat fast path: values, and the rejected words and their indices"},
    {"slow", slow, METH_VARARGS, "one pass of the ziggurat's slow path, into out"},
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
