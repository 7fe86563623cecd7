# SPDX-License-Identifier: Apache-2.0
# nbdsh --opt-mode -u URI: ABORT ends the negotiation; the handle closes.
import os
exec(open(os.environ["NBDSH_COMMON"]).read())
h.set_strict_mode(STRICT_ALL)
h.opt_abort()
show("ABORT closed", h.aio_is_closed())
