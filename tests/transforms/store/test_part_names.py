"""A run's part files are named and parsed in one module (transforms/store/part_names.py): what a writer or a
compaction names is what the waves and the listing read back."""
from __future__ import annotations

from transforms.store import part_names
from transforms.store.files import replaced_by


def test_a_wave_is_read_back_from_every_name_written_for_it() -> None:
    for wave in (0, 7, 99_999):
        for prefix in (part_names.part_prefix(wave), part_names.compacted_prefix(wave)):
            name = part_names.new_part_name(prefix)
            assert name.endswith(".parquet") and name.startswith(f"part-w{wave:05d}-")
            assert part_names.wave_of(f"out/pages/tenant=t/run_id=r/{name}") == wave
    for name in (part_names.new_part_name(), part_names.new_part_name(part_names.compacted_prefix(None))):
        assert part_names.wave_of(f"out/pages/tenant=t/run_id=r/{name}") is None  # no wave's
    assert part_names.new_part_name() != part_names.new_part_name()  # never a name used before


def test_a_sidecar_names_the_compacted_file_beside_it() -> None:
    stem = part_names.new_stem(part_names.compacted_prefix(None))
    folder = "out/ledger/tenant=t/run_id=r"
    sidecar = f"{folder}/{part_names.replaces_name(stem)}"
    compacted = f"{folder}/{part_names.part_name(stem)}"
    assert part_names.replaced_part(part_names.replaces_name(stem)) == part_names.part_name(stem)
    # files.replaced_by counts the sidecar only beside its compacted file
    assert replaced_by([(sidecar, b'["part-old.parquet"]')], {compacted}) == {f"{folder}/part-old.parquet"}
    assert replaced_by([(sidecar, b'["part-old.parquet"]')], set()) == set()
