# SPDX-License-Identifier: Apache-2.0
# nbdsh --opt-mode -u URI: LIST, LIST_META_CONTEXT, INFO (a bad name and
# the export's, with its block sizes), then SET_META_CONTEXT through GO
# with a context that does not exist, in strict mode.
import os
exec(open(os.environ["NBDSH_COMMON"]).read())
h.set_strict_mode(STRICT_ALL)
show("opt mode", h.aio_is_negotiating())
names = []
h.opt_list(lambda name, desc: names.append(name))
show("LIST", names)
contexts = []
h.opt_list_meta_context(lambda name: contexts.append(name))
show("LIST_META_CONTEXT", sorted(contexts))
for c in ("base:allocation", "qemu:allocation-depth", "nope:thing"):
    h.add_meta_context(c)
queried = []
h.opt_list_meta_context(lambda name: queried.append(name))
show("LIST_META_CONTEXT queried", sorted(queried))
want = h.get_export_name()
h.set_export_name("nosuch")
show("INFO nosuch", attempt(h.opt_info))
h.set_export_name(want)
h.opt_info()
show("INFO size", h.get_size())
show("INFO block sizes", [h.get_block_size(s) for s in
                          (nbd.SIZE_MINIMUM, nbd.SIZE_PREFERRED,
                           nbd.SIZE_MAXIMUM)])
h.opt_go()
show("GO size", h.get_size())
show("structured", h.get_structured_replies_negotiated())
for c in ("base:allocation", "qemu:allocation-depth", "nope:thing"):
    show("context " + c, h.can_meta_context(c))
for f in ("is_read_only", "can_flush", "can_fua", "can_trim", "can_zero",
          "can_fast_zero", "can_cache", "can_multi_conn", "can_df"):
    show(f, getattr(h, f)())
h.shutdown()
show("DISC closed", h.aio_is_closed())
