/* kvrelay: every public header, for engines and FFI users that want the
 * whole library (libkvrelay.so). The layers, bottom up: base, layout, plan,
 * gpu, wire, xfer, conn; inspect sits with the tools (docs/architecture.md). */
#ifndef KVRELAY_KVRELAY_H
#define KVRELAY_KVRELAY_H

#include "kvrelay/agent.h"
#include "kvrelay/base.h"
#include "kvrelay/completion.h"
#include "kvrelay/gpu.h"
#include "kvrelay/inspect.h"
#include "kvrelay/layout.h"
#include "kvrelay/plan.h"
#include "kvrelay/status.h"
#include "kvrelay/synth.h"
#include "kvrelay/wire.h"
#include "kvrelay/xfer.h"

#endif
