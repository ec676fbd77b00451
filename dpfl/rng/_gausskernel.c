/* Fast path of dpfl.rng.gauss (the ziggurat's accept test and value) in one pass, for the CPU.
 *
 * fast(words, out, std, wt, kt, flags, rejected) -> count: for each int64 word w, layer i = w & 255,
 * j = (w >> 10) | 1, out = (double)j * wt[i] * std rounded to out's type (float32 or float64);
 * indices with |j| >= kt[i] go to `rejected` (int64) in order (`flags`: n bytes of scratch). The same values as gauss.fast():
 * integer work and two float64 products, built with -ffp-contract=off. Runs with the GIL released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

static int get(PyObject *o, Py_buffer *b, int writable) {
    return PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0));
}

/* Values and a reject flag per word: a loop the compiler vectorizes (gathers, int64 -> double). */
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

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define X86 1
VALUES(values_f32_v4, float, __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw"))))
VALUES(values_f64_v4, double, __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw"))))
VALUES(values_f32_v3, float, __attribute__((target("avx2"))))
VALUES(values_f64_v3, double, __attribute__((target("avx2"))))
#endif
VALUES(values_f32, float, inline)
VALUES(values_f64, double, inline)

static void values(int f32, const int64_t *ws, void *out, uint8_t *flag, Py_ssize_t n, double std,
                   const double *wtab, const int64_t *ktab) {
#ifdef X86
    if (__builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
        if (f32) values_f32_v4(ws, out, flag, n, std, wtab, ktab); else values_f64_v4(ws, out, flag, n, std, wtab, ktab);
        return;
    }
    if (__builtin_cpu_supports("avx2")) {
        if (f32) values_f32_v3(ws, out, flag, n, std, wtab, ktab); else values_f64_v3(ws, out, flag, n, std, wtab, ktab);
        return;
    }
#endif
    if (f32) values_f32(ws, out, flag, n, std, wtab, ktab); else values_f64(ws, out, flag, n, std, wtab, ktab);
}

static PyObject *fast(PyObject *self, PyObject *args) {
    PyObject *ow, *oo, *owt, *okt, *ofl, *orej;
    double std;
    if (!PyArg_ParseTuple(args, "OOdOOOO", &ow, &oo, &std, &owt, &okt, &ofl, &orej)) return NULL;
    Py_buffer w, o, wt, kt, fl, rej;
    if (get(ow, &w, 0)) return NULL;
    if (get(oo, &o, 1)) { PyBuffer_Release(&w); return NULL; }
    if (get(owt, &wt, 0)) { PyBuffer_Release(&w); PyBuffer_Release(&o); return NULL; }
    if (get(okt, &kt, 0)) { PyBuffer_Release(&w); PyBuffer_Release(&o); PyBuffer_Release(&wt); return NULL; }
    if (get(ofl, &fl, 1)) {
        PyBuffer_Release(&w); PyBuffer_Release(&o); PyBuffer_Release(&wt); PyBuffer_Release(&kt); return NULL;
    }
    if (get(orej, &rej, 1)) {
        PyBuffer_Release(&w); PyBuffer_Release(&o); PyBuffer_Release(&wt); PyBuffer_Release(&kt);
        PyBuffer_Release(&fl); return NULL;
    }
    Py_ssize_t n = w.len / 8;
    int f32 = o.itemsize == 4;
    PyObject *res = NULL;
    if (w.itemsize != 8 || (o.itemsize != 4 && o.itemsize != 8) || o.len / o.itemsize != n
        || wt.len != 256 * 8 || kt.len != 256 * 8 || fl.len < n || rej.len / 8 < n) {
        PyErr_SetString(PyExc_ValueError, "gausskernel.fast: bad buffer sizes");
        goto done;
    }
    Py_ssize_t m = 0;
    const int64_t *ws = (const int64_t *)w.buf;
    int64_t *r = (int64_t *)rej.buf;
    uint8_t *flag = (uint8_t *)fl.buf;
    Py_BEGIN_ALLOW_THREADS
    values(f32, ws, o.buf, flag, n, std, (const double *)wt.buf, (const int64_t *)kt.buf);
    Py_ssize_t e = 0;
    for (; e + 8 <= n; e += 8) {
        uint64_t any;
        memcpy(&any, flag + e, 8);
        if (!any) continue;
        for (int q = 0; q < 8; q++)
            if (flag[e + q]) r[m++] = e + q;
    }
    for (; e < n; e++)
        if (flag[e]) r[m++] = e;
    Py_END_ALLOW_THREADS
    res = PyLong_FromSsize_t(m);
done:
    PyBuffer_Release(&w); PyBuffer_Release(&o); PyBuffer_Release(&wt); PyBuffer_Release(&kt); PyBuffer_Release(&fl);
    PyBuffer_Release(&rej);
    return res;
}


/* One pass of gauss.resolve for m open candidates, op for op as the torch code (no contraction):
 * done[e] = 1 and val[e] when resolved, else cand_out[e] = the fresh candidate still rejected. */
static double bits2d(int64_t b) { double d; memcpy(&d, &b, 8); return d; }
static int64_t d2bits(double d) { int64_t b; memcpy(&b, &d, 8); return b; }
static double uniform(int64_t w) { return ((double)((w >> 11) & ((INT64_C(1) << 53) - 1)) + 0.5) * 0x1p-53; }

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

static double zexp_neg(double t) {
    double k = floor(t * 1.4426950408889634 + 0.5);
    double y = k * 6.93147180369123816490e-01;
    y = y - t;
    y = y + k * 1.90821492927058770002e-10;
    double p = inv_fact[14];
    for (int j = 13; j >= 0; j--) { p = p * y; p = p + inv_fact[j]; }
    return p * bits2d((1023 - (int64_t)k) << 52);
}

static PyObject *slow_pass(PyObject *self, PyObject *args) {
    PyObject *oc, *oe, *owt, *okt, *ofx, *ov, *on, *od;
    double std;
    if (!PyArg_ParseTuple(args, "OOdOOOOOO", &oc, &oe, &std, &owt, &okt, &ofx, &ov, &on, &od)) return NULL;
    PyObject *objs[8] = {oc, oe, owt, okt, ofx, ov, on, od};
    int wr[8] = {0, 0, 0, 0, 0, 1, 1, 1};
    Py_buffer b[8];
    int got = 0;
    PyObject *res = NULL;
    for (; got < 8; got++)
        if (get(objs[got], &b[got], wr[got])) goto done;
    Py_ssize_t m = b[0].len / 8;
    if (b[1].len != 24 * m || b[2].len != 256 * 8 || b[3].len != 256 * 8 || b[4].len != 257 * 8
        || b[5].len != 8 * m || b[6].len != 8 * m || b[7].len != m) {
        PyErr_SetString(PyExc_ValueError, "gausskernel.slow_pass: bad buffer sizes");
        goto done;
    }
    const int64_t *c = b[0].buf, *ew = b[1].buf, *kt = b[3].buf;
    const double *wt = b[2].buf, *fx = b[4].buf;
    double *val = b[5].buf;
    int64_t *nc = b[6].buf;
    uint8_t *dn = b[7].buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t e = 0; e < m; e++) {
        int64_t i = c[e] & 255, j = (c[e] >> 10) | 1;
        double x = (double)j * wt[i];
        double u1 = uniform(ew[3 * e]);
        int ok;
        if (i == 0) {
            double xt = -zlog(u1) * 0.2736612373297583; /* gauss.INV_R */
            ok = (-zlog(uniform(ew[3 * e + 1]))) * 2.0 > xt * xt;
            x = j < 0 ? -(xt + 3.6541528853610088) : xt + 3.6541528853610088;
        } else {
            double lo = fx[i];
            double h = (fx[i + 1] - lo) * u1;
            ok = h + lo < zexp_neg((x * x) * 0.5);
        }
        if (ok) { val[e] = x * std; dn[e] = 1; continue; }
        int64_t w = ew[3 * e + 2], i2 = w & 255, j2 = (w >> 10) | 1;
        int64_t a2 = j2 < 0 ? -j2 : j2;
        if (a2 < kt[i2]) { val[e] = ((double)j2 * wt[i2]) * std; dn[e] = 1; }
        else { nc[e] = w; dn[e] = 0; }
    }
    Py_END_ALLOW_THREADS
    res = Py_None;
    Py_INCREF(res);
done:
    for (int q = 0; q < got; q++) PyBuffer_Release(&b[q]);
    return res;
}

static PyMethodDef methods[] = {
    {"fast", fast, METH_VARARGS, "ziggurat fast path: values and rejected indices"},
    {"slow_pass", slow_pass, METH_VARARGS, "one pass of the ziggurat's slow path"},
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
