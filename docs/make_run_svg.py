# Writes docs/run.svg, the picture of a run in README ("How it is built"): python3 docs/make_run_svg.py
W, H = 1110, 430
boxes = {  # name: (x, y, w, h, title, sub)
    "source": (20, 50, 130, 56, "SOURCE", "local, az://, fsspec"),
    "list": (205, 50, 120, 56, "List", "skips what is done"),
    "render": (390, 50, 150, 56, "Render", "worker processes"),
    "route": (610, 50, 120, 56, "Route", "text layer good?"),
    "group": (790, 50, 120, 56, "Group", "document mode"),
    "read": (970, 50, 120, 56, "Read", "the engine"),
    "write": (580, 210, 160, 56, "Write", "part files, atomic"),
    "out": (580, 340, 160, 56, "OUT/pages", "Parquet, a row a page"),
    "prepare": (20, 210, 200, 56, "shard.prepare", "checks, plan, committed"),
    "finish": (870, 340, 200, 56, "shard.finish", "_done marker"),
    "record": (20, 340, 200, 56, "runrecord", "OUT/_runs/RUN_ID.json"),
}
arrows = [("source", "list", "DocRef"), ("list", "render", "RenderTask"), ("render", "route", "Pages"),
          ("route", "group", "Pages"), ("group", "read", "batches"),
          ("render", "write", "error rows"), ("route", "write", "text-layer rows"), ("read", "write", "engine rows"),
          ("write", "out", ""), ("out", "finish", "every page has a row"), ("prepare", "list", "pending"),
          ("prepare", "record", "")]
def c(n):
    x, y, w, h, *_ = boxes[n]; return x + w / 2, y + h / 2
def edge(a, b):
    (ax, ay), (bx, by) = c(a), c(b)
    xa, ya, wa, ha, *_ = boxes[a]; xb, yb, wb, hb, *_ = boxes[b]
    def clip(cx, cy, w, h, dx, dy):
        tx = (w / 2) / abs(dx) if dx else 1e9; ty = (h / 2) / abs(dy) if dy else 1e9
        t = min(tx, ty); return cx + dx * t, cy + dy * t
    dx, dy = bx - ax, by - ay
    return clip(ax, ay, wa, ha, dx, dy), clip(bx, by, wb, hb, -dx, -dy)
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif">',
       '<defs><marker id="a" markerWidth="10" markerHeight="8" refX="9" refY="4" orient="auto"><path d="M0,0 L10,4 L0,8 z" fill="#444"/></marker></defs>',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       '<text x="20" y="24" font-size="14" font-weight="bold">One shard&#8217;s run: batchocr/runner.py wires batchocr/steps.py (with processes N, batchocr/parts.py runs N such runs)</text>']
for a, b, label in arrows:
    (x1, y1), (x2, y2) = edge(a, b)
    out.append(f'<line x1="{x1:.0f}" y1="{y1:.0f}" x2="{x2:.0f}" y2="{y2:.0f}" stroke="#444" stroke-width="1.5" marker-end="url(#a)"/>')
    if label:
        mx, my = (x1 + x2) / 2, (y1 + y2) / 2
        if abs(y1 - y2) < 1:
            out.append(f'<text x="{mx:.0f}" y="{my - 7:.0f}" font-size="11" text-anchor="middle" fill="#333">{label}</text>')
        else:
            out.append(f'<text x="{mx + 6:.0f}" y="{my:.0f}" font-size="11" fill="#333">{label}</text>')
colors = {"source": "#e8f0fe", "out": "#e8f0fe", "prepare": "#fef7e0", "finish": "#fef7e0", "record": "#fef7e0"}
for n, (x, y, w, h, title, sub) in boxes.items():
    out.append(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6" fill="{colors.get(n, "#e6f4ea")}" stroke="#555"/>')
    out.append(f'<text x="{x + w / 2}" y="{y + 23}" font-size="14" text-anchor="middle" font-weight="bold">{title}</text>')
    out.append(f'<text x="{x + w / 2}" y="{y + 42}" font-size="11" text-anchor="middle" fill="#333">{sub}</text>')
out.append('</svg>')
open(__import__("pathlib").Path(__file__).with_name("run.svg"), "w").write("\n".join(out) + "\n")
