// SPDX-License-Identifier: MIT
/*
 * rsock._fastcall - the per-message calls of rsock.socket without cffi's
 * per-call conversions: the buffer protocol straight into rsk_send and
 * rsk_recv (both take ~0.4 µs less than through cffi + ffi.from_buffer,
 * which is as much as the engine's own work on a small message).
 *
 * It links to nothing: rsock._lowlevel (the one module that imports the
 * cffi extension) hands over the addresses of rsk_send/rsk_recv once, with
 * bind(); handles travel as integers (the address of an rsk_sock, kept
 * alive by the caller's Handle for the duration of the call).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "rsock.h"

typedef ssize_t (*io_fn)(void *s, void *buf, size_t len, int flags,
			 int timeout_ms);
typedef ssize_t (*zc_fn)(void *s, size_t len, int flags, int timeout_ms,
			 const void **ptr);
typedef int (*done_fn)(void *s, size_t n);

typedef void (*free_fn)(void *s);
typedef int (*accept_fn)(void *s, int timeout_ms, void **out,
			 struct rsk_addr *src, struct rsk_addr *dst);
typedef int (*connect_bound_fn)(void *s, const char *name, size_t namelen,
				const char *bound, size_t bound_len,
				const struct rsk_addr *src,
				const struct rsk_addr *dst, int timeout_ms);
typedef int (*socket_fn)(void **out);
typedef const char *(*provider_fn)(void *s);

static io_fn fn_send, fn_recv;
static free_fn fn_free; /* rsk_free, for Owner */
static zc_fn fn_recv_zc;   /* (optional: recv_bytes needs both) */
static done_fn fn_recv_done;
static accept_fn fn_accept; /* (optional: accept needs it) */
static connect_bound_fn fn_connect_bound; /* (optional: connect needs it) */
static socket_fn fn_socket; /* (optional: socket needs it) */
static provider_fn fn_provider; /* (optional: accept names the provider) */

/* The socket's address and a timeout in ms (-1 .. INT32_MAX) from two
 * arguments: 0, or -1 with an exception set. */
static int sock_timeout(PyObject *sock, PyObject *ms, void **s, int *timeout)
{
	unsigned long long p;
	long t;

	p = PyLong_AsUnsignedLongLong(sock);
	if (p == (unsigned long long)-1 && PyErr_Occurred())
		return -1;
	t = PyLong_AsLong(ms);
	if (t == -1 && PyErr_Occurred())
		return -1;
	if (t < -1 || t > INT32_MAX) {
		PyErr_SetString(PyExc_OverflowError, "timeout out of range");
		return -1;
	}
	*timeout = (int)t;
	if (!fn_send || !fn_recv) {
		PyErr_SetString(PyExc_RuntimeError, "rsock._fastcall not bound");
		return -1;
	}
	*s = (void *)(uintptr_t)p;
	return 0;
}

/* (sock_addr, buffer, timeout_ms): the socket and the timeout. */
static int get_args(PyObject *const *args, Py_ssize_t nargs, const char *name,
		    void **s, int *timeout)
{
	if (nargs != 3) {
		PyErr_Format(PyExc_TypeError, "%s expects 3 arguments", name);
		return -1;
	}
	return sock_timeout(args[0], args[2], s, timeout);
}

/* One engine call on the buffer of args[1], on its first limit bytes when
 * limit > 0 (ValueError if the buffer is shorter): *rc is fn's result, *len
 * the length used; -1 with an exception set if the arguments are wrong.
 * partial: a send with a timeout returns once some bytes went and the ring
 * is full (send(), as a kernel socket's; not sendall) */
static int fc_io(PyObject *const *args, Py_ssize_t nargs, const char *name,
		 int bufflags, io_fn fn, Py_ssize_t limit, int partial,
		 ssize_t *rc, Py_ssize_t *len)
{
	Py_buffer b;
	void *s;
	int timeout;

	if (get_args(args, nargs, name, &s, &timeout))
		return -1;
	if (PyObject_GetBuffer(args[1], &b, bufflags) < 0)
		return -1;
	if (limit > b.len) {
		PyBuffer_Release(&b);
		PyErr_SetString(PyExc_ValueError,
				"buffer too small for requested bytes");
		return -1;
	}
	*len = limit > 0 ? limit : b.len;
	Py_BEGIN_ALLOW_THREADS
	*rc = fn(s, b.buf, (size_t)*len,
		 partial && timeout > 0 ? RSK_F_PARTIAL : 0, timeout);
	Py_END_ALLOW_THREADS
	PyBuffer_Release(&b);
	return 0;
}

/* recv_into(sock_addr, buffer, timeout_ms[, nbytes]) -> rsk_recv's result;
 * nbytes as socket.recv_into's (0: the whole buffer) */
static PyObject *fc_recv_into(PyObject *self, PyObject *const *args,
			      Py_ssize_t nargs)
{
	Py_ssize_t len, limit = 0;
	ssize_t rc;

	(void)self;
	if (nargs == 4) {
		limit = PyNumber_AsSsize_t(args[3], PyExc_OverflowError);
		if (limit == -1 && PyErr_Occurred())
			return NULL;
		if (limit < 0) {
			PyErr_SetString(PyExc_ValueError,
					"negative buffersize in recv_into");
			return NULL;
		}
		nargs = 3;
	}
	if (fc_io(args, nargs, "recv_into", PyBUF_WRITABLE, fn_recv, limit, 0,
		  &rc, &len))
		return NULL;
	return PyLong_FromSsize_t(rc);
}

/* recv_bytes(sock_addr, nbytes, timeout_ms) -> bytes (b"" at EOF) or
 * rsk_recv_zc's -errno: up to nbytes that are readable now (contiguous in
 * the ring: a wrap splits them) copied once, straight out of the ring,
 * into a bytes object of their size.  The receive side is held only
 * between the two engine calls; the copy happens with the GIL (it must:
 * the bytes object is Python's), the wait without it. */
static PyObject *fc_recv_bytes(PyObject *self, PyObject *const *args,
			       Py_ssize_t nargs)
{
	Py_ssize_t limit;
	const void *ptr = NULL;
	PyObject *out;
	ssize_t rc;
	void *s;
	int timeout;

	(void)self;
	if (nargs != 3) {
		PyErr_SetString(PyExc_TypeError, "recv_bytes expects 3 arguments");
		return NULL;
	}
	limit = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
	if (limit == -1 && PyErr_Occurred())
		return NULL;
	if (limit <= 0) {
		PyErr_SetString(PyExc_ValueError, "recv_bytes needs nbytes > 0");
		return NULL;
	}
	if (sock_timeout(args[0], args[2], &s, &timeout))
		return NULL;
	if (!fn_recv_zc || !fn_recv_done) {
		PyErr_SetString(PyExc_RuntimeError, "rsock._fastcall not bound");
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS
	rc = fn_recv_zc(s, (size_t)limit, 0, timeout, &ptr);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return PyLong_FromSsize_t(rc);
	if (rc == 0)
		return PyBytes_FromStringAndSize(NULL, 0);
	out = PyBytes_FromStringAndSize((const char *)ptr, rc);
	fn_recv_done(s, out ? (size_t)rc : 0); /* (no memory: nothing taken) */
	return out;
}

/* An address a client announced, as the socket module shows one: (host,
 * port) or (host, port, flowinfo, scope_id); None if it is not an IPv4 or
 * IPv6 one (the peer is not trusted: rsock.socket then shows its own). */
static PyObject *addr_tuple(const struct rsk_addr *a)
{
	char host[INET6_ADDRSTRLEN];

	if (a->family == AF_INET) {
		if (!inet_ntop(AF_INET, a->addr, host, sizeof(host)))
			Py_RETURN_NONE;
		return Py_BuildValue("(sH)", host, a->port);
	}
	if (a->family == AF_INET6) {
		if (!inet_ntop(AF_INET6, a->addr, host, sizeof(host)))
			Py_RETURN_NONE;
		return Py_BuildValue("(sHII)", host, a->port, a->flowinfo,
				     a->scope_id);
	}
	Py_RETURN_NONE;
}

/* accept(listener_addr, timeout_ms) -> rsk_accept's -errno, or (rc,
 * new_sock_addr, peer address or None, local address the peer dialed or
 * None, the connection's provider as rsk_provider names it): one call for
 * what took four cffi allocations, two address conversions and a cffi
 * call with a decode in Python per accepted connection. */
static PyObject *fc_accept(PyObject *self, PyObject *const *args,
			   Py_ssize_t nargs)
{
	struct rsk_addr src, dst;
	PyObject *peer, *local, *r;
	void *s, *out = NULL;
	int timeout, rc;

	(void)self;
	if (nargs != 2) {
		PyErr_SetString(PyExc_TypeError, "accept expects 2 arguments");
		return NULL;
	}
	if (sock_timeout(args[0], args[1], &s, &timeout))
		return NULL;
	if (!fn_accept) {
		PyErr_SetString(PyExc_RuntimeError, "rsock._fastcall not bound");
		return NULL;
	}
	memset(&src, 0, sizeof(src));
	memset(&dst, 0, sizeof(dst));
	Py_BEGIN_ALLOW_THREADS
	rc = fn_accept(s, timeout, &out, &src, &dst);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return PyLong_FromLong(rc);
	peer = addr_tuple(&src);
	local = peer ? addr_tuple(&dst) : NULL;
	r = local ? Py_BuildValue("(iKOOs)", rc,
				  (unsigned long long)(uintptr_t)out, peer,
				  local, fn_provider ? fn_provider(out) : "")
		  : NULL;
	Py_XDECREF(peer);
	Py_XDECREF(local);
	if (!r && fn_free)
		fn_free(out); /* (no memory: the connection goes, not leaks) */
	return r;
}

/* An address as the socket module gives one, (host, port) or (host, port,
 * flowinfo, scope_id) with a numeric host, into *a for family: 0, or -1
 * with an exception set (the caller checked and resolved it already). */
static int addr_fill(struct rsk_addr *a, int family, PyObject *t)
{
	const char *host;
	long port;
	unsigned long flow = 0, scope = 0;
	Py_ssize_t n;

	if (!PyTuple_Check(t)) {
		PyErr_SetString(PyExc_TypeError, "address must be a tuple");
		return -1;
	}
	n = PyTuple_GET_SIZE(t);
	if (n < 2 || n > 4) {
		PyErr_SetString(PyExc_TypeError, "address must have 2 to 4 items");
		return -1;
	}
	host = PyUnicode_AsUTF8(PyTuple_GET_ITEM(t, 0));
	if (!host)
		return -1;
	port = PyLong_AsLong(PyTuple_GET_ITEM(t, 1));
	if (port == -1 && PyErr_Occurred())
		return -1;
	if (n >= 3) {
		flow = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(t, 2));
		if (flow == (unsigned long)-1 && PyErr_Occurred())
			return -1;
	}
	if (n == 4) {
		scope = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(t, 3));
		if (scope == (unsigned long)-1 && PyErr_Occurred())
			return -1;
	}
	if (port < 0 || port > 65535 || flow > UINT32_MAX || scope > UINT32_MAX) {
		PyErr_SetString(PyExc_OverflowError, "address field out of range");
		return -1;
	}
	memset(a, 0, sizeof(*a));
	if ((family != AF_INET && family != AF_INET6) ||
	    inet_pton(family, host, a->addr) != 1) {
		PyErr_SetString(PyExc_ValueError, "not a numeric address");
		return -1;
	}
	a->family = (uint16_t)family;
	a->port = (uint16_t)port;
	a->flowinfo = (uint32_t)flow;
	a->scope_id = (uint32_t)scope;
	return 0;
}

/* connect(sock_addr, name, bound, family, src, dst, timeout_ms) ->
 * rsk_connect_bound's result (rsk_connect's when bound is None): the
 * addresses as the socket module's tuples, numeric; one call for what
 * took two cffi allocations and two address conversions in Python per
 * connection. */
static PyObject *fc_connect(PyObject *self, PyObject *const *args,
			    Py_ssize_t nargs)
{
	struct rsk_addr src, dst;
	char *name, *bound = NULL;
	Py_ssize_t namelen, boundlen = 0;
	long family;
	void *s;
	int timeout, rc;

	(void)self;
	if (nargs != 7) {
		PyErr_SetString(PyExc_TypeError, "connect expects 7 arguments");
		return NULL;
	}
	if (sock_timeout(args[0], args[6], &s, &timeout))
		return NULL;
	if (!fn_connect_bound) {
		PyErr_SetString(PyExc_RuntimeError, "rsock._fastcall not bound");
		return NULL;
	}
	if (PyBytes_AsStringAndSize(args[1], &name, &namelen) < 0)
		return NULL;
	if (args[2] != Py_None &&
	    PyBytes_AsStringAndSize(args[2], &bound, &boundlen) < 0)
		return NULL;
	family = PyLong_AsLong(args[3]);
	if (family == -1 && PyErr_Occurred())
		return NULL;
	if (addr_fill(&src, (int)family, args[4]) ||
	    addr_fill(&dst, (int)family, args[5]))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = fn_connect_bound(s, name, (size_t)namelen, bound, (size_t)boundlen,
			      &src, &dst, timeout);
	Py_END_ALLOW_THREADS
	return PyLong_FromLong(rc);
}

/* socket() -> rsk_socket's -errno, or the new rsk_sock's address */
static PyObject *fc_socket(PyObject *self, PyObject *unused)
{
	void *out = NULL;
	int rc;

	(void)self;
	(void)unused;
	if (!fn_socket) {
		PyErr_SetString(PyExc_RuntimeError, "rsock._fastcall not bound");
		return NULL;
	}
	rc = fn_socket(&out);
	if (rc < 0)
		return PyLong_FromLong(rc);
	return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)out);
}

/* rsk_send on data; all: None when it took all of data */
static PyObject *fc_send_common(PyObject *const *args, Py_ssize_t nargs,
				const char *name, int all)
{
	ssize_t rc;
	Py_ssize_t len;

	if (fc_io(args, nargs, name, PyBUF_SIMPLE, fn_send, 0, !all, &rc, &len))
		return NULL;
	if (all && rc == len)
		Py_RETURN_NONE;
	return PyLong_FromSsize_t(rc);
}

/* send(sock_addr, data, timeout_ms) -> rsk_send's result */
static PyObject *fc_send(PyObject *self, PyObject *const *args,
			 Py_ssize_t nargs)
{
	(void)self;
	return fc_send_common(args, nargs, "send", 0);
}

/* sendall(sock_addr, data, timeout_ms) -> None when rsk_send took all of
 * data, else its result (bytes taken, or -errno) */
static PyObject *fc_sendall(PyObject *self, PyObject *const *args,
			    Py_ssize_t nargs)
{
	(void)self;
	return fc_send_common(args, nargs, "sendall", 1);
}

/* bind(send_addr, recv_addr[, recv_zc_addr, recv_done_addr[, free_addr[,
 * accept_addr[, connect_bound_addr, socket_addr, provider_addr]]]]): the
 * engine's entry points */
static PyObject *fc_bind(PyObject *self, PyObject *const *args,
			 Py_ssize_t nargs)
{
	unsigned long long a[9] = { 0, 0, 0, 0, 0, 0, 0, 0, 0 };
	Py_ssize_t i;

	(void)self;
	if (nargs != 2 && nargs != 4 && nargs != 5 && nargs != 6 &&
	    nargs != 9) {
		PyErr_SetString(PyExc_TypeError,
				"bind expects 2, 4, 5, 6 or 9 arguments");
		return NULL;
	}
	for (i = 0; i < nargs; i++) {
		a[i] = PyLong_AsUnsignedLongLong(args[i]);
		if (PyErr_Occurred())
			return NULL;
		if (!a[i]) {
			PyErr_SetString(PyExc_ValueError, "null entry point");
			return NULL;
		}
	}
	fn_send = (io_fn)(uintptr_t)a[0];
	fn_recv = (io_fn)(uintptr_t)a[1];
	if (nargs >= 4) {
		fn_recv_zc = (zc_fn)(uintptr_t)a[2];
		fn_recv_done = (done_fn)(uintptr_t)a[3];
	}
	if (nargs >= 5)
		fn_free = (free_fn)(uintptr_t)a[4];
	if (nargs >= 6)
		fn_accept = (accept_fn)(uintptr_t)a[5];
	if (nargs == 9) {
		fn_connect_bound = (connect_bound_fn)(uintptr_t)a[6];
		fn_socket = (socket_fn)(uintptr_t)a[7];
		fn_provider = (provider_fn)(uintptr_t)a[8];
	}
	Py_RETURN_NONE;
}

/*
 * Owner(sock_addr): owns an rsk_sock and rsk_free()s it when the last
 * reference goes.  Deliberately neither a GC type nor one with a finalizer
 * (cffi's ffi.gc() objects have one): the garbage collector never finalizes
 * or clears an Owner itself, so in a reference cycle every rsock.socket's
 * __del__ (a finalizer, run first for the whole cycle) still finds its
 * connection; the Owner goes only when what holds it is cleared, after.
 * With ffi.gc(), a cycle's finalizers ran in list order, and the handle's
 * often came first: the socket's __del__ then closed freed memory.
 */
typedef struct {
	PyObject_HEAD
	void *s;
} OwnerObject;

static void owner_dealloc(OwnerObject *o)
{
	if (o->s && fn_free)
		fn_free(o->s);
	Py_TYPE(o)->tp_free((PyObject *)o);
}

static PyObject *owner_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	unsigned long long p;
	OwnerObject *o;

	if (kw && PyDict_GET_SIZE(kw)) {
		PyErr_SetString(PyExc_TypeError, "Owner takes no keyword arguments");
		return NULL;
	}
	if (!PyArg_ParseTuple(args, "K:Owner", &p))
		return NULL;
	if (!fn_free) {
		PyErr_SetString(PyExc_RuntimeError, "rsock._fastcall not bound");
		return NULL;
	}
	o = (OwnerObject *)type->tp_alloc(type, 0);
	if (o)
		o->s = (void *)(uintptr_t)p;
	return (PyObject *)o;
}

static PyTypeObject OwnerType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "rsock._fastcall.Owner",
	.tp_basicsize = sizeof(OwnerObject),
	.tp_dealloc = (destructor)owner_dealloc,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Owner(sock_addr): rsk_free()s the rsk_sock when released",
	.tp_new = owner_new,
};

static PyMethodDef fc_methods[] = {
	{ "recv_into", (PyCFunction)(void (*)(void))fc_recv_into, METH_FASTCALL,
	  "recv_into(sock_addr, buffer, timeout_ms[, nbytes]) -> rsk_recv result" },
	{ "recv_bytes", (PyCFunction)(void (*)(void))fc_recv_bytes, METH_FASTCALL,
	  "recv_bytes(sock_addr, nbytes, timeout_ms) -> bytes or -errno" },
	{ "send", (PyCFunction)(void (*)(void))fc_send, METH_FASTCALL,
	  "send(sock_addr, data, timeout_ms) -> rsk_send result" },
	{ "sendall", (PyCFunction)(void (*)(void))fc_sendall, METH_FASTCALL,
	  "sendall(sock_addr, data, timeout_ms) -> None or rsk_send result" },
	{ "accept", (PyCFunction)(void (*)(void))fc_accept, METH_FASTCALL,
	  "accept(listener_addr, timeout_ms) -> -errno or (rc, sock_addr, peer, local, provider)" },
	{ "connect", (PyCFunction)(void (*)(void))fc_connect, METH_FASTCALL,
	  "connect(sock_addr, name, bound, family, src, dst, timeout_ms) -> "
	  "rsk_connect_bound result" },
	{ "socket", (PyCFunction)fc_socket, METH_NOARGS,
	  "socket() -> -errno or the new rsk_sock's address" },
	{ "bind", (PyCFunction)(void (*)(void))fc_bind, METH_FASTCALL,
	  "bind(rsk_send_addr, rsk_recv_addr[, rsk_recv_zc_addr, rsk_recv_done_addr"
	  "[, rsk_free_addr[, rsk_accept_addr[, rsk_connect_bound_addr,"
	  " rsk_socket_addr, rsk_provider_addr]]]])" },
	{ NULL, NULL, 0, NULL },
};

static struct PyModuleDef fc_module = {
	PyModuleDef_HEAD_INIT, "rsock._fastcall",
	"rsock.socket's per-message calls without cffi conversions", -1,
	fc_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastcall(void)
{
	PyObject *m;

	if (PyType_Ready(&OwnerType) < 0)
		return NULL;
	m = PyModule_Create(&fc_module);
	if (!m)
		return NULL;
	Py_INCREF(&OwnerType);
	if (PyModule_AddObject(m, "Owner", (PyObject *)&OwnerType) < 0) {
		Py_DECREF(&OwnerType);
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
