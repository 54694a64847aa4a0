/* A prepared kernel's repeated launch in one C call from Python (issue 10 item 3: the direct API's host overhead).
 *
 * launch(record, stream, pointers) -> CUresult: record is the address of a LaunchRecord that fast_launch.py fills
 * once per prepared kernel; pointers is a list of ints (the present inputs, then the outputs). The kernel parameters
 * are built on this call's stack, so concurrent calls need no lock; the driver copies them during cuLaunchKernel.
 * The driver entry points come from Python (ctypes addresses in libcuda), so nothing here links against CUDA. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_PARAMS 64 /* fast_launch.py refuses a record with more */

typedef int (*CtxGetCurrentFn)(void **);
typedef int (*CtxPushCurrentFn)(void *);
typedef int (*CtxPopCurrentFn)(void **);
typedef int (*LaunchKernelFn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                              void **, void **);

/* Field for field the ctypes Structure LaunchRecord in fast_launch.py. */
typedef struct {
    LaunchKernelFn launch_kernel;
    CtxGetCurrentFn ctx_get_current;
    CtxPushCurrentFn ctx_push_current;
    CtxPopCurrentFn ctx_pop_current;
    void *function;
    void *context;
    void **params;        /* the kernel's parameter addresses; the pointer slots are filled per call */
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t shared;
    int32_t n_inputs;     /* pointer slots 0 .. n_inputs-1, then n_scalars scalars, then the output slots */
    int32_t n_outputs;
    int32_t n_scalars;
} LaunchRecord;

static int launch_on_context(const LaunchRecord *r, void *stream, void **params) {
    void *current = NULL;
    int err = r->ctx_get_current(&current);
    if (err) return err;
    if (current == r->context)
        return r->launch_kernel(r->function, r->grid[0], r->grid[1], r->grid[2], r->block[0], r->block[1],
                                r->block[2], r->shared, stream, params, NULL);
    /* another (or no) context is current on this thread: make the device's primary one current for the launch */
    err = r->ctx_push_current(r->context);
    if (err) return err;
    err = r->launch_kernel(r->function, r->grid[0], r->grid[1], r->grid[2], r->block[0], r->block[1], r->block[2],
                           r->shared, stream, params, NULL);
    int pop_err = r->ctx_pop_current(&current);
    return err ? err : pop_err;
}

static PyObject *fast_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3 || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "launch(record, stream, pointers): pointers must be a list of ints");
        return NULL;
    }
    const LaunchRecord *r = (const LaunchRecord *)PyLong_AsVoidPtr(args[0]);
    void *stream = PyLong_AsVoidPtr(args[1]);
    if (PyErr_Occurred()) return NULL;
    PyObject *list = args[2];
    const Py_ssize_t n = PyList_GET_SIZE(list);
    if (n != r->n_inputs + r->n_outputs) {
        PyErr_Format(PyExc_ValueError, "the kernel takes %d input and %d output pointers, got %zd",
                     (int)r->n_inputs, (int)r->n_outputs, n);
        return NULL;
    }
    uint64_t values[MAX_PARAMS];
    void *params[MAX_PARAMS];
    memcpy(params, r->params, sizeof(void *) * (size_t)(r->n_inputs + r->n_scalars + r->n_outputs));
    for (Py_ssize_t i = 0; i < n; ++i) {
        values[i] = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(list, i));
        params[i < r->n_inputs ? i : i + r->n_scalars] = &values[i];
    }
    if (PyErr_Occurred()) return NULL;
    int err;
    Py_BEGIN_ALLOW_THREADS /* the launch may wait for room in the launch queue: other Python threads go on */
    err = launch_on_context(r, stream, params);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(err);
}

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))fast_launch, METH_FASTCALL,
     "launch(record, stream, pointers) -> CUresult: one prepared kernel launch"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fast_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit_fast_launch(void) { return PyModule_Create(&module); }
