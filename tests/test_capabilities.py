"""What each source kind offers beyond the Source protocol (reclock.sources.base: typed capabilities, not probes)."""
from __future__ import annotations

import pytest

from reclock.sources import source_class
from reclock.sources.base import (LandsTicks, NamedPartitions, PrimaryKeys, Retiring, Snapshotting, TableColumns,
                                 Truncating, offers)

CAPABILITIES = (Snapshotting, LandsTicks, Truncating, TableColumns, PrimaryKeys, NamedPartitions, Retiring)

#: kind -> the capabilities its class offers (a Postgres source's ``snapshot`` is also an option of each source).
OFFERED = {
    "kafka": set(),
    "files": {NamedPartitions, Retiring},
    "cdcv2": set(),
    "kinesis": {LandsTicks},
    "postgres": {Snapshotting, Truncating, TableColumns, PrimaryKeys},
}


@pytest.mark.parametrize("kind", sorted(OFFERED))
def test_each_kind_offers_its_capabilities(kind):
    cls = source_class(kind)
    assert {c for c in CAPABILITIES if offers(cls, c)} == OFFERED[kind]


def test_a_capability_lacking_one_member_is_not_offered():
    class Half:  # snapshot and export_snapshot, but no slot to drop or to ask for
        snapshot = True

        def export_snapshot(self):
            raise AssertionError("never called")

    class Whole(Half):
        def started(self) -> bool:
            return False

        def drop_slot(self) -> None:
            pass

        def begin_new_epoch(self, name, bound, start, landed, drop_slot):
            return None

    assert not offers(Half(), Snapshotting) and offers(Whole(), Snapshotting) and offers(Whole, Snapshotting)
    assert not offers(None, PrimaryKeys)  # a kind without a class of its own (source_class: None)
