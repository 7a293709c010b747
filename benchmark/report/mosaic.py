"""Grid mosaics: the fixed-noise sample grids of one leaderboard block side by side, captioned."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
from PIL import Image, ImageDraw, ImageFont

from dfbench.benchmark.report.formatting import fmt_metric, rank_text


def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has no sized default font
        return ImageFont.load_default()


def _wrap(text: str, draw: ImageDraw.ImageDraw, font: Any, width: int) -> list[str]:
    """Greedy word wrap to a pixel width (params strings can be long)."""
    lines: list[str] = []
    current = ""
    for word in text.split(" "):
        trial = f"{current} {word}".strip()
        if current and draw.textlength(trial, font=font) > width:
            lines.append(current)
            current = word
        else:
            current = trial
    if current:
        lines.append(current)
    return lines or [""]


def make_mosaic(block: pd.DataFrame, title: str, out_path: Path, min_tile: int = 192) -> tuple[Path | None, list[str]]:
    """Side-by-side grids of one block (first seed per setting), captioned with rank, the page's name
    for the setting (`names.setting_names`: the method, the hyperparameters off its defaults and the
    config that tells it apart from the block's others, e.g. DP's "(clip=2, noise=0.1)") and score."""
    notes: list[str] = []
    tiles: list[tuple[Image.Image, list[str]]] = []
    from dfbench.benchmark.report.names import setting_names

    names = setting_names(block)
    for idx, row in block.iterrows():
        if not row["grid"]:
            notes.append(f"{row['setting']}: no grid.png")
            continue
        try:
            with Image.open(row["grid"]) as img:
                tile = img.convert("RGB")
        except (OSError, ValueError) as exc:
            notes.append(f"{row['setting']}: grid.png unreadable ({exc})")
            continue
        primary = row["primary_metric"]
        score = f"{primary} {fmt_metric(row, primary, int(row['n']))}" if primary and row[f"{primary}_n"] else "no score"
        name = names[idx]  # the page's name: the hyperparameters off the method's defaults, not all of them
        # as the page writes the rank; "-" for the range: the caption font has no en dash
        rank = "" if pd.isna(row["rank"]) else f"#{rank_text(row).replace(chr(8211), '-')} "
        caption = [f"{rank}{name}", score, f"seed {row['grid_seed']}"]
        tiles.append((tile, [c for c in caption if c]))
    if not tiles:
        return None, notes + [f"{title}: no readable grid.png, mosaic skipped"]
    # Grids are small (32x32 cells); upscale with NEAREST so pixels stay crisp and captions fit.
    side = max(min_tile, max(max(t.size) for t, _ in tiles))
    font, title_font = _font(13), _font(18)
    scratch = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    line_h = 16
    pad = 10
    wrapped = [[ln for c in caption for ln in _wrap(c, scratch, font, side)] for _, caption in tiles]
    caption_h = line_h * max(len(w) for w in wrapped) + pad
    cols = min(len(tiles), 6)
    rows = math.ceil(len(tiles) / cols)
    title_h = 34
    width = pad + cols * (side + pad)
    height = title_h + rows * (side + caption_h + pad)
    canvas = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(canvas)
    draw.text((pad, 8), title, fill="black", font=title_font)
    for i, ((tile, _), lines) in enumerate(zip(tiles, wrapped)):
        x = pad + (i % cols) * (side + pad)
        y = title_h + (i // cols) * (side + caption_h + pad)
        scale = side / max(tile.size)
        resized = tile.resize((max(1, round(tile.width * scale)), max(1, round(tile.height * scale))), Image.NEAREST)
        canvas.paste(resized, (x, y))
        for j, line in enumerate(lines):
            draw.text((x, y + side + 4 + j * line_h), line, fill="black", font=font)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(out_path)
    return out_path, notes
