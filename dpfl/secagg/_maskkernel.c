/* Mask kernel for dpfl.secagg.prg: the same words as the pure-Python path, faster.
 *
 * mask_segment expands, for one keystream segment, every seed of a mask plan with AES-256 in
 * counter mode (counter blocks s||j+2, the definition in prg.py) and adds or subtracts it into
 * the rows that use it, in column blocks small enough that a block's keystream and rows stay
 * in L1/L2; then reduces the rows whose last mask it was. It runs with the GIL released.
 *
 * The AES rounds are the CPU's: constant time, no tables. Level 3 (`cpu_level()`): VAES on
 * 512-bit registers, where the CPU has AVX-512F/BW and VAES; level 2: VAES on 256-bit registers,
 * where it has AVX2 and VAES but not AVX-512 (AMD Zen 3); level 1: AES-NI on 128-bit registers
 * (any x86-64 with AES-NI and SSE4.1). Only built for x86-64 with GCC or Clang;
 * elsewhere (level 0) prg.py keeps its own path. Tests check the words bit for bit against
 * OpenSSL (`cryptography`) and against the pure-Python path, at every level the CPU has.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DPFL_X86 1
#include <immintrin.h>
#endif

#define SEED_BYTES 32
#define BLOCK_WORDS_BYTES 4096 /* column block: 256 AES blocks */

#ifdef DPFL_X86
#include <cpuid.h>
#define TGT_AES __attribute__((target("aes,sse4.1")))
#define TGT __attribute__((target("aes,sse4.1,avx2,avx512f,avx512bw,vaes")))
#define TGT256 __attribute__((target("aes,sse4.1,avx2,vaes")))
#define INLINE static inline __attribute__((always_inline))

/* w0, w0^w1, w0^w1^w2, w0^w1^w2^w3: the running xor of a round key's four words. */
TGT_AES static inline __m128i prefix_xor(__m128i t) {
    t = _mm_xor_si128(t, _mm_slli_si128(t, 4));
    return _mm_xor_si128(t, _mm_slli_si128(t, 8));
}

/* Even round key: previous even key, RotWord/SubWord/rcon of the odd one (from keygenassist). */
TGT_AES static inline __m128i assist_1(__m128i t1, __m128i t2) {
    return _mm_xor_si128(prefix_xor(t1), _mm_shuffle_epi32(t2, 0xff));
}

/* Odd round key: previous odd key, SubWord of the new even one. */
TGT_AES static inline __m128i assist_2(__m128i t1, __m128i t3) {
    return _mm_xor_si128(prefix_xor(t3), _mm_shuffle_epi32(_mm_aeskeygenassist_si128(t1, 0x0), 0xaa));
}

/* AES-256 key expansion (FIPS-197), 15 round keys. */
#define EXPAND(rcon, i)                                          \
    t2 = _mm_aeskeygenassist_si128(t3, rcon);                    \
    t1 = assist_1(t1, t2);                                       \
    rk[i] = t1;                                                  \
    if ((i) + 1 < 15) { t3 = assist_2(t1, t3); rk[(i) + 1] = t3; }

TGT_AES static void expand_key(const uint8_t *key, __m128i rk[15]) {
    __m128i t1 = _mm_loadu_si128((const __m128i *)key);
    __m128i t3 = _mm_loadu_si128((const __m128i *)(key + 16));
    __m128i t2;
    rk[0] = t1;
    rk[1] = t3;
    EXPAND(0x01, 2) EXPAND(0x02, 4) EXPAND(0x04, 6) EXPAND(0x08, 8)
    EXPAND(0x10, 10) EXPAND(0x20, 12) EXPAND(0x40, 14)
}

/* out[0..nblk) = AES_k(ctr[0..nblk)), nblk a multiple of 4; 16 blocks per step when possible. */
TGT static void encrypt_vaes(const __m128i key[15], const uint8_t *ctr, uint8_t *out, size_t nblk) {
    __m512i rk[15];
    for (int r = 0; r < 15; r++) rk[r] = _mm512_broadcast_i32x4(_mm_loadu_si128(key + r));
    size_t i = 0;
    for (; i + 16 <= nblk; i += 16) {
        __m512i a = _mm512_loadu_si512(ctr + 16 * i), b = _mm512_loadu_si512(ctr + 16 * i + 64);
        __m512i c = _mm512_loadu_si512(ctr + 16 * i + 128), d = _mm512_loadu_si512(ctr + 16 * i + 192);
        a = _mm512_xor_si512(a, rk[0]); b = _mm512_xor_si512(b, rk[0]);
        c = _mm512_xor_si512(c, rk[0]); d = _mm512_xor_si512(d, rk[0]);
        for (int r = 1; r < 14; r++) {
            a = _mm512_aesenc_epi128(a, rk[r]); b = _mm512_aesenc_epi128(b, rk[r]);
            c = _mm512_aesenc_epi128(c, rk[r]); d = _mm512_aesenc_epi128(d, rk[r]);
        }
        _mm512_storeu_si512(out + 16 * i, _mm512_aesenclast_epi128(a, rk[14]));
        _mm512_storeu_si512(out + 16 * i + 64, _mm512_aesenclast_epi128(b, rk[14]));
        _mm512_storeu_si512(out + 16 * i + 128, _mm512_aesenclast_epi128(c, rk[14]));
        _mm512_storeu_si512(out + 16 * i + 192, _mm512_aesenclast_epi128(d, rk[14]));
    }
    for (; i < nblk; i += 4) {
        __m512i a = _mm512_xor_si512(_mm512_loadu_si512(ctr + 16 * i), rk[0]);
        for (int r = 1; r < 14; r++) a = _mm512_aesenc_epi128(a, rk[r]);
        _mm512_storeu_si512(out + 16 * i, _mm512_aesenclast_epi128(a, rk[14]));
    }
}

/* The same on 256-bit registers (two blocks each), 16 blocks per step when possible (nblk a
 * multiple of 4, so the tail goes two blocks at a time). */
TGT256 static void encrypt_vaes256(const __m128i key[15], const uint8_t *ctr, uint8_t *out, size_t nblk) {
    __m256i rk[15];
    for (int r = 0; r < 15; r++) rk[r] = _mm256_broadcastsi128_si256(_mm_loadu_si128(key + r));
    size_t i = 0;
    for (; i + 16 <= nblk; i += 16) {
        __m256i b[8];
        for (int j = 0; j < 8; j++) b[j] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(ctr + 16 * i + 32 * j)), rk[0]);
        for (int r = 1; r < 14; r++)
            for (int j = 0; j < 8; j++) b[j] = _mm256_aesenc_epi128(b[j], rk[r]);
        for (int j = 0; j < 8; j++) _mm256_storeu_si256((__m256i *)(out + 16 * i + 32 * j), _mm256_aesenclast_epi128(b[j], rk[14]));
    }
    for (; i < nblk; i += 2) {
        __m256i a = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(ctr + 16 * i)), rk[0]);
        for (int r = 1; r < 14; r++) a = _mm256_aesenc_epi128(a, rk[r]);
        _mm256_storeu_si256((__m256i *)(out + 16 * i), _mm256_aesenclast_epi128(a, rk[14]));
    }
}

/* The same with AES-NI on 128-bit registers, 8 blocks per step (nblk a multiple of 4). */
TGT_AES static void encrypt_ni(const __m128i key[15], const uint8_t *ctr, uint8_t *out, size_t nblk) {
    __m128i rk[15];
    for (int r = 0; r < 15; r++) rk[r] = _mm_loadu_si128(key + r);
    size_t i = 0;
    for (; i + 8 <= nblk; i += 8) {
        __m128i b[8];
        for (int j = 0; j < 8; j++) b[j] = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(ctr + 16 * (i + j))), rk[0]);
        for (int r = 1; r < 14; r++)
            for (int j = 0; j < 8; j++) b[j] = _mm_aesenc_si128(b[j], rk[r]);
        for (int j = 0; j < 8; j++) _mm_storeu_si128((__m128i *)(out + 16 * (i + j)), _mm_aesenclast_si128(b[j], rk[14]));
    }
    for (; i < nblk; i++) {
        __m128i b = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(ctr + 16 * i)), rk[0]);
        for (int r = 1; r < 14; r++) b = _mm_aesenc_si128(b, rk[r]);
        _mm_storeu_si128((__m128i *)(out + 16 * i), _mm_aesenclast_si128(b, rk[14]));
    }
}

typedef void (*encrypt_fn)(const __m128i *, const uint8_t *, uint8_t *, size_t);

INLINE void add_words(uint8_t *dst, const uint8_t *src, size_t nbytes, int itemsize, int sign) {
    if (itemsize == 4) {
        uint32_t *d = (uint32_t *)dst;
        const uint32_t *s = (const uint32_t *)src;
        size_t n = nbytes / 4;
        if (sign > 0) for (size_t i = 0; i < n; i++) d[i] += s[i];
        else for (size_t i = 0; i < n; i++) d[i] -= s[i];
    } else {
        uint64_t *d = (uint64_t *)dst;
        const uint64_t *s = (const uint64_t *)src;
        size_t n = nbytes / 8;
        if (sign > 0) for (size_t i = 0; i < n; i++) d[i] += s[i];
        else for (size_t i = 0; i < n; i++) d[i] -= s[i];
    }
}

INLINE void and_words(uint8_t *dst, size_t nbytes, int itemsize, uint64_t keep) {
    if (itemsize == 4) {
        uint32_t *d = (uint32_t *)dst, k = (uint32_t)keep;
        for (size_t i = 0; i < nbytes / 4; i++) d[i] &= k;
    } else {
        uint64_t *d = (uint64_t *)dst;
        for (size_t i = 0; i < nbytes / 8; i++) d[i] &= keep;
    }
}

/* The kernel: columns [c0, c0 + nbytes) (bytes from each row's start), the start of segment `seg`.
 * Inlined into one wrapper per level, so its adds are compiled for that level's vector width. */
INLINE void kernel(uint8_t *base, Py_ssize_t row_stride, int itemsize, Py_ssize_t c0, Py_ssize_t nbytes,
                   uint64_t seg, const uint8_t *seeds, Py_ssize_t nseeds, const int64_t *use_ptr,
                   const int64_t *use_row, const int8_t *use_sign, const int64_t *red_ptr,
                   const int64_t *red_row, uint64_t keep, __m128i *rk, encrypt_fn encrypt) {
    uint8_t ctr[BLOCK_WORDS_BYTES] __attribute__((aligned(64)));
    uint8_t ks[BLOCK_WORDS_BYTES] __attribute__((aligned(64)));
    for (Py_ssize_t i = 0; i < nseeds; i++) {
        __m128i k[15];
        expand_key(seeds + SEED_BYTES * i, k);
        for (int r = 0; r < 15; r++) _mm_storeu_si128(rk + 15 * i + r, k[r]);
    }
    uint8_t nonce[12];
    for (int b = 0; b < 12; b++) nonce[b] = (b < 4) ? 0 : (uint8_t)(seg >> (8 * (11 - b)));
    for (Py_ssize_t off = 0; off < nbytes; off += BLOCK_WORDS_BYTES) {
        Py_ssize_t len = nbytes - off < BLOCK_WORDS_BYTES ? nbytes - off : BLOCK_WORDS_BYTES;
        size_t nblk = (size_t)((len + 63) / 64) * 4; /* whole 64-byte groups */
        uint64_t j0 = (uint64_t)off / 16;
        for (size_t j = 0; j < nblk; j++) {
            uint32_t c = (uint32_t)(j0 + j + 2);
            memcpy(ctr + 16 * j, nonce, 12);
            ctr[16 * j + 12] = (uint8_t)(c >> 24);
            ctr[16 * j + 13] = (uint8_t)(c >> 16);
            ctr[16 * j + 14] = (uint8_t)(c >> 8);
            ctr[16 * j + 15] = (uint8_t)c;
        }
        for (Py_ssize_t i = 0; i < nseeds; i++) {
            encrypt(rk + 15 * i, ctr, ks, nblk);
            for (int64_t u = use_ptr[i]; u < use_ptr[i + 1]; u++)
                add_words(base + use_row[u] * row_stride + c0 + off, ks, (size_t)len, itemsize, use_sign[u]);
            if (keep)
                for (int64_t u = red_ptr[i]; u < red_ptr[i + 1]; u++)
                    and_words(base + red_row[u] * row_stride + c0 + off, (size_t)len, itemsize, keep);
        }
    }
}

#define KERNEL_ARGS                                                                                        \
    uint8_t *base, Py_ssize_t row_stride, int itemsize, Py_ssize_t c0, Py_ssize_t nbytes, uint64_t seg,    \
        const uint8_t *seeds, Py_ssize_t nseeds, const int64_t *use_ptr, const int64_t *use_row,           \
        const int8_t *use_sign, const int64_t *red_ptr, const int64_t *red_row, uint64_t keep, __m128i *rk
#define KERNEL_CALL(fn) \
    kernel(base, row_stride, itemsize, c0, nbytes, seg, seeds, nseeds, use_ptr, use_row, use_sign, red_ptr, red_row, keep, rk, fn)

TGT static void kernel_vaes(KERNEL_ARGS) { KERNEL_CALL(encrypt_vaes); }
TGT256 static void kernel_vaes256(KERNEL_ARGS) { KERNEL_CALL(encrypt_vaes256); }
TGT_AES static void kernel_ni(KERNEL_ARGS) { KERNEL_CALL(encrypt_ni); }

/* VAES from CPUID leaf 7 (ECX bit 9): some compilers (Clang 14) do not know the feature name */
static int has_vaes(void) {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c >> 9 & 1);
}

static int cpu_level(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("aes") || !__builtin_cpu_supports("sse4.1")) return 0;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && has_vaes()) return 3;
    if (__builtin_cpu_supports("avx2") && has_vaes()) return 2;
    return 1;
}
#else
static int cpu_level(void) { return 0; }
#endif

static PyObject *py_cpu_level(PyObject *self, PyObject *args) { return PyLong_FromLong(cpu_level()); }

/* int_range(buf, itemsize, signed) -> (min, max) of a buffer of 4- or 8-byte integers, one pass,
 * GIL released (plain C: any CPU; an AVX2 clone where the CPU has it). For the range checks of
 * the secure sum's integer encoding. */
#if defined(DPFL_X86) && defined(__linux__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

CLONES static void range_i32(const int32_t *x, Py_ssize_t n, int64_t *mn, int64_t *mx) {
    int32_t lo = INT32_MAX, hi = INT32_MIN;
    for (Py_ssize_t i = 0; i < n; i++) { lo = x[i] < lo ? x[i] : lo; hi = x[i] > hi ? x[i] : hi; }
    *mn = lo, *mx = hi;
}

CLONES static void range_i64(const int64_t *x, Py_ssize_t n, int64_t *mn, int64_t *mx) {
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (Py_ssize_t i = 0; i < n; i++) { lo = x[i] < lo ? x[i] : lo; hi = x[i] > hi ? x[i] : hi; }
    *mn = lo, *mx = hi;
}

CLONES static void range_u32(const uint32_t *x, Py_ssize_t n, uint64_t *mn, uint64_t *mx) {
    uint32_t lo = UINT32_MAX, hi = 0;
    for (Py_ssize_t i = 0; i < n; i++) { lo = x[i] < lo ? x[i] : lo; hi = x[i] > hi ? x[i] : hi; }
    *mn = lo, *mx = hi;
}

CLONES static void range_u64(const uint64_t *x, Py_ssize_t n, uint64_t *mn, uint64_t *mx) {
    uint64_t lo = UINT64_MAX, hi = 0;
    for (Py_ssize_t i = 0; i < n; i++) { lo = x[i] < lo ? x[i] : lo; hi = x[i] > hi ? x[i] : hi; }
    *mn = lo, *mx = hi;
}

static PyObject *int_range(PyObject *self, PyObject *args) {
    Py_buffer b;
    int itemsize, is_signed;
    if (!PyArg_ParseTuple(args, "y*ip", &b, &itemsize, &is_signed)) return NULL;
    if ((itemsize != 4 && itemsize != 8) || b.len % itemsize || b.len == 0) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "int_range: need a non-empty buffer of 4- or 8-byte integers");
        return NULL;
    }
    Py_ssize_t n = b.len / itemsize;
    int64_t smin = INT64_MAX, smax = INT64_MIN;
    uint64_t umin = UINT64_MAX, umax = 0;
    Py_BEGIN_ALLOW_THREADS
    if (is_signed && itemsize == 4) range_i32(b.buf, n, &smin, &smax);
    else if (is_signed) range_i64(b.buf, n, &smin, &smax);
    else if (itemsize == 4) range_u32(b.buf, n, &umin, &umax);
    else range_u64(b.buf, n, &umin, &umax);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    if (is_signed) return Py_BuildValue("(LL)", (long long)smin, (long long)smax);
    return Py_BuildValue("(KK)", (unsigned long long)umin, (unsigned long long)umax);
}

/* mask_segment(y, row_stride, itemsize, seg, c0, nbytes, seg_bytes, seeds, use_ptr, use_row, use_sign,
 *              red_ptr, red_row, keep, level): level 1 to 3, at most cpu_level(); y a C-contiguous word matrix, c0 = seg·seg_bytes; seeds
 *              concatenated; for seed i, rows use_row[use_ptr[i]:use_ptr[i+1]] (int64) get sign
 *              use_sign (int8, +1/−1), then rows red_row[red_ptr[i]:red_ptr[i+1]] are ANDed with
 *              keep (0: none). */
static PyObject *mask_segment(PyObject *self, PyObject *args) {
    Py_buffer y, seeds, up, ur, us, rp, rr;
    Py_ssize_t row_stride, c0, nbytes, seg_bytes;
    int itemsize, level;
    unsigned long long seg, keep;
    if (!PyArg_ParseTuple(args, "w*niKnnny*y*y*y*y*y*Ki", &y, &row_stride, &itemsize, &seg, &c0, &nbytes,
                          &seg_bytes, &seeds, &up, &ur, &us, &rp, &rr, &keep, &level))
        return NULL;
    PyObject *ret = NULL;
    Py_ssize_t nseeds = seeds.len / SEED_BYTES;
    if (level < 1 || level > cpu_level()) {
        PyErr_Format(PyExc_RuntimeError, "mask kernel: level %d not available on this CPU (level %d)", level,
                     cpu_level());
    } else if ((itemsize != 4 && itemsize != 8) || seeds.len % SEED_BYTES || up.len != 8 * (nseeds + 1) ||
               rp.len != 8 * (nseeds + 1) || us.len * 8 != ur.len || c0 < 0 || nbytes < 0 ||
               nbytes % itemsize || seg_bytes <= 0 || seg_bytes % 64 || c0 != (Py_ssize_t)seg * seg_bytes ||
               nbytes > seg_bytes) {
        PyErr_SetString(PyExc_ValueError, "mask kernel: inconsistent arguments");
    } else {
        const int64_t *uptr = up.buf, *urow = ur.buf, *rptr = rp.buf, *rrow = rr.buf;
        Py_ssize_t nrows = row_stride ? y.len / row_stride + (y.len % row_stride ? 1 : 0) : 1;
        int bad = uptr[0] != 0 || uptr[nseeds] != ur.len / 8 || rptr[0] != 0 || rptr[nseeds] != rr.len / 8;
        for (Py_ssize_t i = 0; !bad && i < ur.len / 8; i++)
            bad = urow[i] < 0 || urow[i] >= nrows || urow[i] * row_stride + c0 + nbytes > y.len;
        for (Py_ssize_t i = 0; !bad && i < rr.len / 8; i++)
            bad = rrow[i] < 0 || rrow[i] >= nrows || rrow[i] * row_stride + c0 + nbytes > y.len;
        for (Py_ssize_t i = 0; !bad && i < nseeds; i++)
            bad = uptr[i] > uptr[i + 1] || rptr[i] > rptr[i + 1];
        const int8_t *sgn = us.buf;
        for (Py_ssize_t i = 0; !bad && i < us.len; i++) bad = sgn[i] != 1 && sgn[i] != -1;
        if (bad) {
            PyErr_SetString(PyExc_ValueError, "mask kernel: row index or plan out of range");
        } else {
#ifdef DPFL_X86
            /* round keys, 16-byte aligned; a failure raises: a row is never sent without its masks */
            __m128i *rk = PyMem_RawMalloc(sizeof(__m128i) * 15 * (size_t)(nseeds ? nseeds : 1));
            if (!rk) {
                PyErr_NoMemory();
            } else {
                Py_BEGIN_ALLOW_THREADS
                (level == 3 ? kernel_vaes : level == 2 ? kernel_vaes256 : kernel_ni)(
                    (uint8_t *)y.buf, row_stride, itemsize, c0, nbytes, (uint64_t)seg, seeds.buf, nseeds, uptr,
                    urow, sgn, rptr, rrow, (uint64_t)keep, rk);
                Py_END_ALLOW_THREADS
                volatile uint8_t *wipe = (volatile uint8_t *)rk; /* round keys are key material */
                for (size_t i = 0; i < sizeof(__m128i) * 15 * (size_t)(nseeds ? nseeds : 1); i++) wipe[i] = 0;
                PyMem_RawFree(rk);
                ret = Py_NewRef(Py_None);
            }
#endif
        }
    }
    PyBuffer_Release(&y);
    PyBuffer_Release(&seeds);
    PyBuffer_Release(&up);
    PyBuffer_Release(&ur);
    PyBuffer_Release(&us);
    PyBuffer_Release(&rp);
    PyBuffer_Release(&rr);
    return ret;
}

static PyMethodDef methods[] = {
    {"cpu_level", py_cpu_level, METH_NOARGS,
     "3: VAES + AVX-512, 2: VAES + AVX2, 1: AES-NI + SSE4.1, 0: no kernel on this CPU."},
    {"int_range", int_range, METH_VARARGS, "(min, max) of a buffer of 4- or 8-byte integers."},
    {"mask_segment", mask_segment, METH_VARARGS, "Mask one keystream segment of a word matrix in place."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_maskkernel", NULL, -1, methods};

PyMODINIT_FUNC PyInit__maskkernel(void) { return PyModule_Create(&module); }
