/* Status codes. Every fallible public function returns one; the message that explains it
 * (with file:line) is kept in the context and read with nt_last_error(). */
#ifndef NT_STATUS_H
#define NT_STATUS_H

#ifdef __cplusplus
#define NT_EXTERN_C_BEGIN extern "C" {
#define NT_EXTERN_C_END }
#else
#define NT_EXTERN_C_BEGIN
#define NT_EXTERN_C_END
#endif

NT_EXTERN_C_BEGIN

typedef enum {
  NT_OK = 0,
  NT_ERR_INVALID_ARG,  /* a bad option or argument value */
  NT_ERR_SHAPE,        /* tensor shapes that do not fit together */
  NT_ERR_DTYPE,        /* a dtype the operation does not support */
  NT_ERR_DEVICE,       /* tensors on the wrong device, or mixed devices */
  NT_ERR_OOM,          /* out of host or device memory */
  NT_ERR_NO_DEVICE,    /* no GPU, no driver, or the backend is not compiled in */
  NT_ERR_CUDA,         /* a CUDA runtime error */
  NT_ERR_CUBLAS,       /* a cuBLAS / cuBLASLt error */
  NT_ERR_NCCL,         /* an NCCL or MPI error */
  NT_ERR_IO,           /* a file that cannot be opened, read or written */
  NT_ERR_FORMAT,       /* a corrupt, truncated or foreign file */
  NT_ERR_UNSUPPORTED,  /* valid, but not implemented for this case */
  NT_ERR_STATE,        /* a call out of order (misuse of a stateful object) */
  NT_ERR_INTERNAL,     /* a bug in nanotrain */
  NT_STATUS_COUNT
} nt_status;

/* A short fixed name for a status ("shape error", ...). */
const char *nt_status_str(nt_status st);

NT_EXTERN_C_END

#endif
