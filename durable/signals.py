"""Django signals durable sends, for receivers in the project (archival, alerting)."""

from __future__ import annotations

from django.dispatch import Signal

#: Sent by the retention sweep before it deletes a finished run's tree, with ``sender`` the Run
#: model, ``run`` the root Run and ``run_ids`` every run of the tree (the root first). Sent inside
#: the deleting transaction, so a receiver reads the whole tree as it is. A receiver that raises
#: keeps the tree (logged; the next pass tries again): archive it, then let it go.
run_evicting = Signal()
