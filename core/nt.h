/* The whole public core in one include. */
#ifndef NT_H
#define NT_H
#include "core/status.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "core/ctx.h"
#include "core/memory.h"
#include "core/stream.h"
#include "core/rng.h"
#include "core/convert.h"
#endif
