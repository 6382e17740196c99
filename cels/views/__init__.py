"""Each node's view of a session: recorded while it runs (:mod:`cels.views.record`), read back
and summarised (:mod:`cels.views.read`), drawn (:mod:`cels.views.draw`).  Outside
:mod:`cels.protocol`: recording does file I/O, drawing uses matplotlib."""

from cels.views.read import (
    PHASE_ORDER,
    NodeView,
    ViewEntry,
    load_node_view,
    load_views,
    mermaid,
    summarise,
    summary_markdown,
)
from cels.views.record import ViewRecorder, describe, record_hosts, record_session, record_views

__all__ = [
    "PHASE_ORDER", "NodeView", "ViewEntry", "ViewRecorder", "describe", "load_node_view", "load_views", "mermaid",
    "record_hosts", "record_session", "record_views", "summarise", "summary_markdown",
]  # fmt: skip
