"""The service's maintenance, run by the workers on RQ's maintenance tick (never by a GET).

* Placements RQ ended on its own (failed after its retry, abandoned by a killed worker,
  stopped) or whose job vanished get their end written to the record
  (:func:`baechi.jobs.lifecycle.settle`), and leave their tenant's active set.
* Tenants' placement indexes lose the ids of records that expired.

One worker sweeps per interval (a Redis lock), whichever gets there first.
"""

from __future__ import annotations

from baechi.jobs import queue as jobqueue
from baechi.jobs.lifecycle import settle
from baechi.jobs.settings import Settings
from baechi.jobs.store import PREFIX, Store

LOCK_KEY = f"{PREFIX}:sweep"
#: Oldest index entries checked per tenant and sweep: expired ids collect at the old end.
TRIM_BATCH = 500


def sweep(store: Store, settings: Settings) -> None:
    """Settle ended placements and trim expired ids; a no-op if another worker just did."""
    if not store.redis.set(LOCK_KEY, b"1", nx=True, ex=max(1, settings.worker_maintenance_s)):
        return
    for tenant in store.tenants_with_active():
        ids = store.active(tenant)
        records = store.get_many(ids)
        store.forget_active(tenant, [pid for pid, record in zip(ids, records, strict=True)
                                     if record is None or record.terminal])
        live = [record for record in records if record is not None and not record.terminal]
        found = jobqueue.fetch_many(store.redis, [record.id for record in live])
        for record, job in zip(live, found, strict=True):
            settle(store, settings, record, job)
    for tenant in store.tenants():
        ids = store.oldest(tenant, TRIM_BATCH)
        records = store.get_many(ids)
        store.forget(tenant, [pid for pid, record in zip(ids, records, strict=True)
                              if record is None])
