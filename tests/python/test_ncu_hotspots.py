"""bench/ncu_hotspots.py on a small source-view CSV written the way ncu writes it."""

import importlib.util
import pathlib

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "ncu_hotspots.py"
spec = importlib.util.spec_from_file_location("ncu_hotspots", SCRIPT)
ncu_hotspots = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ncu_hotspots)

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
          '"stall_wait","stall_long_sb","stall_wait (Not Issued)"')
ROWS = [
    ('0x1000', "      S2R R0, SR_TID.X", "1", "8", "1", "0", "0"),
    ('0x1010', "      IADD3 R1, R0, 0x1, RZ", "10", "1,600", "9", "1", "0"),
    ('0x1020', "      STG.E desc[UR4][R2.64], R1", "30", "1,600", "2", "28", "0"),
    ('0x1030', "@!P0  BRA 0x1010", "20", "1,600", "20", "0", "0"),
    ('0x1040', "      EXIT", "0", "8", "0", "0", "0"),
]


def write_csv(tmp_path):
    lines = ['"Kernel Name","k()"', HEADER] + [",".join(f'"{cell}"' for cell in row) for row in ROWS]
    path = tmp_path / "src.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_reads_rows_and_finds_the_loop(tmp_path):
    instructions = ncu_hotspots.read_source(write_csv(tmp_path))
    assert [i[0] for i in instructions] == [0x1000, 0x1010, 0x1020, 0x1030, 0x1040]
    assert instructions[2][2:4] == (30.0, 1600.0)  # samples, executed (thousands separator read)
    assert instructions[2][4] == {"wait": 2.0, "long_sb": 28.0}  # "(Not Issued)" columns left out
    assert ncu_hotspots.loops(instructions) == [(1, 3)]


def test_report_gives_the_loop_share(tmp_path, capsys):
    assert ncu_hotspots.main([str(write_csv(tmp_path)), "--top", "2"]) == 0
    report = capsys.readouterr().out
    assert "5 SASS instructions, 61 stall samples" in report
    assert "3 instructions   98.4% of samples" in report  # (10 + 30 + 20) / 61
    assert "long_sb 28" in report
