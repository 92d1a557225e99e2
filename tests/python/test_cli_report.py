"""`python -m flashjit ...` (the flashjit command line inside the extension module) and
`flashjit report` rendered by headless Chromium: a screenshot of each kind of plot must show its
content (not a blank area) in the colors the report gives it. Chromium comes from Debian's
`chromium` package (scripts/common.sh installs it for CI); without it the rendering test skips
and tests/cli/report_command_test.cpp still checks the HTML's structure.
"""
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib

import pytest

import flashjit
from conftest import REPO_ROOT

PEERS_JSON = os.path.join(REPO_ROOT, "docs", "perf", "nvidia-h100-80gb-hbm3-2026-11-23-bwd.json")
CHOSEN, DEFAULT, OTHER, CUDNN = (214, 39, 40), (255, 152, 150), (31, 119, 180), (44, 160, 44)


def flashjit_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "flashjit", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def test_python_m_flashjit_is_the_command_line():
    version = flashjit_cli("--version")
    assert version.returncode == 0, version.stderr
    assert "generator " + flashjit._flashjit.generator_version() in version.stdout
    usage = flashjit_cli("--help")
    assert usage.returncode == 0
    for command in ("plan", "tune", "db", "report"):
        assert "\n  " + command + " " in usage.stdout
    bad = flashjit_cli("plan", "--head-dim", "100")
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "--head-dim" in bad.stderr, bad.stderr
    assert flashjit_cli("bogus").returncode == 2
    plan = flashjit_cli("plan", "--arch", "sm90", "--head-dim", "128")
    assert plan.returncode == 0 and "legal" in plan.stdout, plan.stderr


def test_the_package_ships_every_committed_tuning_db():
    # data/tuning/<device>.sql -> flashjit/tuning/<device>.db in the package, where the runtime
    # reads it as a system DB (tests/cli/package_test.cpp checks the serving on the CMake install).
    names = sorted(f[:-4] for f in os.listdir(os.path.join(REPO_ROOT, "data", "tuning"))
                   if f.endswith(".sql"))
    if not names:
        pytest.skip("no shipped tuning DB committed in data/tuning/ yet")
    folder = os.path.join(os.path.dirname(flashjit.__file__), "tuning")
    for name in names:
        assert os.path.isfile(os.path.join(folder, name + ".db")), (name, folder)
        listed = flashjit_cli("db", "ls", "--all", "--db", os.path.join(folder, name + ".db"))
        assert listed.returncode == 0 and " choices" in listed.stdout, listed.stderr


# --- The report in Chromium -------------------------------------------------------------------

def chromium():
    for name in (os.environ.get("FLASHJIT_CHROMIUM"), "chromium", "chromium-browser",
                 "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def read_png(path):
    """(width, height, rows of (r, g, b) tuples) of an 8-bit RGB or RGBA PNG (what Chromium
    writes), with the scanline filters undone."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    at, idat = 8, b""
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6), (depth, color)
        elif kind == b"IDAT":
            idat += body
        at += 12 + length
    channels = 4 if color == 6 else 3
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - channels] if x >= channels else 0
            b = previous[x]
            c = previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + a) & 255
            elif kind == 2:
                line[x] = (line[x] + b) & 255
            elif kind == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[i:i + 3]) for i in range(0, stride, channels)])
        previous = line
    return width, height, rows


def screenshot(browser, html_path, png_path, width, height):
    ran = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                          "--hide-scrollbars", "--window-size=%d,%d" % (width, height),
                          "--screenshot=" + png_path, "file://" + html_path],
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and os.path.exists(png_path), ran.stderr[-2000:]
    return read_png(png_path)


def near(pixel, color, tolerance=40):
    return sum(abs(p - c) for p, c in zip(pixel, color)) <= tolerance


def inked(rows):
    """The share of pixels that are not (near) white, and the set of pixels."""
    pixels = [p for row in rows for p in row]
    return sum(1 for p in pixels if sum(p) < 3 * 235) / len(pixels), pixels


# A tuning DB in its text form (flashjit db export FILE.sql): one key, three timed configs (the
# fastest chosen, the default the slowest) and one that failed.
TEXT_DB = """-- flashjit tuning DB, text form; schema_version 2
INSERT INTO devices (device, backend, name, arch, sm_count, smem_per_block_optin, l2_bytes, \
driver_version, compiler) VALUES ('cuda|Fake GPU|sm90', 'cuda', 'Fake GPU', 90, 132, 232448, \
52428800, 13000, 'nvrtc 13.0');
"""
for config, (bm, bn, w, s), ms, default in [("m128n64w8s2", (128, 64, 8, 2), 1.0, 0),
                                            ("m64n64w4s2", (64, 64, 4, 2), 1.5, 0),
                                            ("m128n128w8s2", (128, 128, 8, 2), 2.0, 1)]:
    TEXT_DB += ("INSERT INTO results (device, generator, pass, deterministic, head_dim, dtype, "
                "causal, group_size, seqlen_q_bucket, seqlen_k_bucket, batch_heads_bucket, config, "
                "block_m, block_n, warps, stages, status, median_ms, min_ms, max_ms, repetitions, "
                "tflops, is_default, message, recorded_at) VALUES ('cuda|Fake GPU|sm90', "
                "'0123456789abcdef', 'fwd', 0, 128, 'bf16', 1, 1, 4096, 4096, 32, '%s', %d, %d, "
                "%d, %d, 'timed', %g, %g, %g, 10, %g, %d, '', '2026-11-23 10:00:00.000');\n"
                % (config, bm, bn, w, s, ms, ms, ms, 400 / ms, default))
TEXT_DB += ("INSERT INTO results (device, generator, pass, deterministic, head_dim, dtype, causal, "
            "group_size, seqlen_q_bucket, seqlen_k_bucket, batch_heads_bucket, config, block_m, "
            "block_n, warps, stages, status, median_ms, min_ms, max_ms, repetitions, tflops, "
            "is_default, message, recorded_at) VALUES ('cuda|Fake GPU|sm90', '0123456789abcdef', "
            "'fwd', 0, 128, 'bf16', 1, 1, 4096, 4096, 32, 'm256n128w8s3', 256, 128, 8, 3, "
            "'compile-failed', 0, 0, 0, 0, 0, 0, 'too much shared memory', "
            "'2026-11-23 10:00:00.000');\n"
            "INSERT INTO choices (device, generator, pass, deterministic, head_dim, dtype, causal, "
            "group_size, seqlen_q_bucket, seqlen_k_bucket, batch_heads_bucket, config, median_ms, "
            "default_ms, chosen_at) VALUES ('cuda|Fake GPU|sm90', '0123456789abcdef', 'fwd', 0, "
            "128, 'bf16', 1, 1, 4096, 4096, 32, 'm128n64w8s2', 1, 2, '2026-11-23 10:00:00.000');\n")


def test_report_renders_its_plots_in_chromium(tmp_path):
    (tmp_path / "tuning.sql").write_text(TEXT_DB)
    db = str(tmp_path / "tuning.db")
    merged = flashjit_cli("db", "merge", db, str(tmp_path / "tuning.sql"))
    assert merged.returncode == 0, merged.stderr
    html = str(tmp_path / "report.html")
    written = flashjit_cli("report", "--db", db, "--side-by-side", PEERS_JSON, "--out", html)
    assert written.returncode == 0, written.stderr
    page = open(html).read()
    assert page.count('<rect class="bar"') == 3 and "too much shared memory" in page

    browser = chromium()
    if browser is None:
        pytest.skip("no Chromium here (Debian: apt-get install chromium); the HTML's structure is "
                    "checked by tests/cli/report_command_test.cpp")
    # The whole page: it renders, with ink.
    _, _, rows = screenshot(browser, html, str(tmp_path / "page.png"), 1300, 1600)
    share, _ = inked(rows)
    assert share > 0.03, "the report's first screen is (nearly) blank: %.3f inked" % share

    # Each kind of plot alone, at its own size: not blank, and drawn in the report's colors.
    svgs = re.findall(r"<svg class=\"(bars|lines)\".*?</svg>", page, flags=re.S)
    assert svgs[:1] == ["bars"] and "lines" in svgs
    for kind, colors, minimum in [("bars", (CHOSEN, DEFAULT, OTHER), 0.05),
                                  ("lines", (CHOSEN, DEFAULT, OTHER, CUDNN), 0.02)]:
        svg = re.search(r"<svg class=\"%s\".*?</svg>" % kind, page, flags=re.S).group(0)
        width, height = (int(v) for v in re.search(r'width="(\d+)" height="(\d+)"', svg).groups())
        alone = tmp_path / (kind + ".html")
        alone.write_text("<!DOCTYPE html><html><body style=\"margin:0\">%s</body></html>" % svg)
        _, _, rows = screenshot(browser, str(alone), str(tmp_path / (kind + ".png")), width,
                                height)
        share, pixels = inked(rows)
        assert share > minimum, "the %s plot is (nearly) blank: %.3f inked" % (kind, share)
        for color in colors:
            hits = sum(1 for p in pixels if near(p, color))
            assert hits > 20, "the %s plot shows no %s (%d pixels)" % (kind, color, hits)
