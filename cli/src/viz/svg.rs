//! The layout as an SVG picture: a lane per rank, a column per step, an arrow per message coloured by its chunk's
//! position (⊕ where the receiver reduces), local copies and reductions inside their lane, and a legend.

use super::layout::{describe, Arrow, Layout, Local};
use collc_compiler::VerifiedSchedule;
use std::collections::HashMap;
use std::fmt::Write;

const LEFT: u32 = 84;
const TOP: u32 = 34;
const COLUMN: u32 = 112;
const LANE: u32 = 64;
const RIGHT: u32 = 16;
/// Where an arrow starts and ends inside its column.
const INSET: u32 = 18;
const LEGEND_ROW: u32 = 26;

/// Tableau's ten colours: distinct on screen and in print; positions past ten repeat them (the legend says so).
const PALETTE: [&str; 10] =
    ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];

pub fn colour(position: u32) -> &'static str {
    PALETTE[position as usize % PALETTE.len()]
}

/// Text safe inside an XML element or attribute.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn lane_y(rank: u32) -> f64 {
    (TOP + rank * LANE + LANE / 2) as f64
}

fn column_x(step: u32) -> f64 {
    (LEFT + step * COLUMN) as f64
}

/// The whole picture. `title` names what is drawn; `messages`, when given, is each arrow's value (a tooltip line).
pub fn render(verified: &VerifiedSchedule, layout: &Layout, title: &str, messages: Option<&[String]>) -> String {
    let width = LEFT + layout.n_steps.max(1) * COLUMN + RIGHT;
    let lanes_bottom = TOP + layout.n_ranks * LANE;
    let legend = legend(layout.chunks, width);
    let height = lanes_bottom + 12 + legend.rows * LEGEND_ROW;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" id="schedule" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="13">"#
    );
    let _ = writeln!(svg, "<title>{}</title>", escape(title));
    svg += r##"<rect width="100%" height="100%" fill="#ffffff"/>
"##;
    draw_grid(&mut svg, layout, width);
    svg += "<g id=\"arrows\">\n";
    let sched = verified.schedule();
    let spread = spread(layout);
    for (i, arrow) in layout.arrows.iter().enumerate() {
        let (rank, index) = arrow.recv;
        let receiver = describe(sched, &sched.ranks[rank as usize].instrs[index as usize]);
        let chunk = chunk_label(arrow.position, arrow.count, layout.chunks);
        let mut tip =
            format!("step {}: rank {} → rank {}, chunk {chunk}: {receiver}", arrow.step, arrow.from, arrow.to);
        if let Some(value) = messages.and_then(|m| m.get(i)) {
            tip += &format!(" (carries {value})");
        }
        draw_arrow(&mut svg, arrow, spread[i], &tip, layout.chunks);
    }
    svg += "</g>\n<g id=\"locals\">\n";
    for (i, local) in layout.locals.iter().enumerate() {
        let instr = &sched.ranks[local.rank as usize].instrs[local.index as usize];
        draw_local(&mut svg, layout, i, &describe(sched, instr));
    }
    svg += "</g>\n";
    svg += &legend.svg.replace("{Y}", &(lanes_bottom + 12).to_string());
    svg += "</svg>\n";
    svg
}

/// The columns (shaded alternately, each labelled `step k`) and the lanes (each labelled `rank r`).
fn draw_grid(svg: &mut String, layout: &Layout, width: u32) {
    let lanes_bottom = TOP + layout.n_ranks * LANE;
    *svg += "<g id=\"columns\">\n";
    for step in 0..layout.n_steps {
        let x = column_x(step);
        let fill = if step % 2 == 0 { "#f6f7f9" } else { "#ffffff" };
        let _ = writeln!(
            svg,
            r#"<rect class="column" data-step="{step}" x="{x}" y="{top}" width="{COLUMN}" height="{h}" fill="{fill}"/>"#,
            top = TOP - 4,
            h = lanes_bottom - TOP + 8
        );
        let _ = writeln!(
            svg,
            r#"<text class="step-label" data-step="{step}" x="{cx}" y="{y}" text-anchor="middle" font-weight="bold">step {step}</text>"#,
            cx = x + COLUMN as f64 / 2.0,
            y = TOP - 12
        );
    }
    *svg += "</g>\n<g id=\"lanes\">\n";
    for rank in 0..layout.n_ranks {
        let y = lane_y(rank);
        let _ = writeln!(
            svg,
            r##"<g class="lane" data-rank="{rank}"><line x1="{LEFT}" y1="{y}" x2="{x2}" y2="{y}" stroke="#9aa0a6" stroke-width="1.5"/><text x="{tx}" y="{ty}" text-anchor="end" font-weight="bold">rank {rank}</text></g>"##,
            x2 = width - RIGHT,
            tx = LEFT - 10,
            ty = y + 4.5
        );
    }
    *svg += "</g>\n";
}

/// `c3`, or `c3..c5` for a message of three chunks: positions in the block.
fn chunk_label(position: u32, count: u32, chunks: u32) -> String {
    match count {
        1 => format!("c{position}"),
        n => format!("c{position}..c{}", (position + n - 1) % chunks.max(1)),
    }
}

/// How far (in pixels, up or down) each arrow's ends are moved so that arrows leaving one lane in one column stay
/// apart, and so do those arriving at one: (start, end) per arrow.
fn spread(layout: &Layout) -> Vec<(f64, f64)> {
    let leaving = offsets(layout, |a| (a.step, a.from));
    let arriving = offsets(layout, |a| (a.step, a.to));
    leaving.into_iter().zip(arriving).collect()
}

/// Each arrow's place among the arrows with its `key`, as an offset around 0.
fn offsets(layout: &Layout, key: impl Fn(&Arrow) -> (u32, u32)) -> Vec<f64> {
    let mut siblings: HashMap<(u32, u32), u32> = HashMap::new();
    let mut seen: HashMap<(u32, u32), u32> = HashMap::new();
    for arrow in &layout.arrows {
        *siblings.entry(key(arrow)).or_default() += 1;
    }
    let place = |arrow: &Arrow| {
        let count = siblings[&key(arrow)] as f64;
        let nth = seen.entry(key(arrow)).or_default();
        *nth += 1;
        let gap = (LANE as f64 * 0.6 / count).min(16.0);
        ((*nth - 1) as f64 - (count - 1.0) / 2.0) * gap
    };
    layout.arrows.iter().map(place).collect()
}

fn draw_arrow(svg: &mut String, arrow: &Arrow, (dy0, dy1): (f64, f64), tip: &str, chunks: u32) {
    let colour = colour(arrow.position);
    let x0 = column_x(arrow.step) + INSET as f64;
    let x1 = column_x(arrow.step) + (COLUMN - INSET) as f64;
    let (y0, y1) = (lane_y(arrow.from) + dy0, lane_y(arrow.to) + dy1);
    let (dx, dyy) = (x1 - x0, y1 - y0);
    let length = (dx * dx + dyy * dyy).sqrt().max(1.0);
    let (ux, uy) = (dx / length, dyy / length);
    // The line stops where the head (a triangle, or the ⊕ of a reducing receive) begins.
    let stop = if arrow.reduce { 7.0 } else { 9.0 };
    let (lx, ly) = (x1 - ux * stop, y1 - uy * stop);
    let _ = write!(
        svg,
        r#"<g class="arrow" data-step="{step}" data-from="{from}" data-to="{to}" data-chunk="{position}" data-channel="{channel}" data-reduce="{reduce}"><title>{tip}</title><line x1="{x0:.1}" y1="{y0:.1}" x2="{lx:.1}" y2="{ly:.1}" stroke="{colour}" stroke-width="2.5"/>"#,
        step = arrow.step,
        from = arrow.from,
        to = arrow.to,
        position = arrow.position,
        reduce = arrow.reduce,
        channel = arrow.channel,
        tip = escape(tip),
    );
    if arrow.reduce {
        oplus(svg, x1 - ux * 7.0, y1 - uy * 7.0, 7.0, colour);
    } else {
        let (bx, by) = (x1 - ux * 9.0, y1 - uy * 9.0);
        let (px, py) = (-uy * 5.0, ux * 5.0);
        let _ = write!(
            svg,
            r#"<polygon points="{x1:.1},{y1:.1} {:.1},{:.1} {:.1},{:.1}" fill="{colour}"/>"#,
            bx + px,
            by + py,
            bx - px,
            by - py
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" font-size="10" fill="{colour}">{}</text></g>"#,
        x0 - 2.0,
        y0 - 5.0,
        chunk_label(arrow.position, arrow.count, chunks)
    );
}

/// The reduction mark: a circle with a plus, in the chunk's colour.
fn oplus(svg: &mut String, cx: f64, cy: f64, r: f64, colour: &str) {
    let _ = write!(
        svg,
        r##"<circle class="oplus" cx="{cx:.1}" cy="{cy:.1}" r="{r}" fill="#ffffff" stroke="{colour}" stroke-width="2"/><path d="M{:.1} {cy:.1}H{:.1}M{cx:.1} {:.1}V{:.1}" stroke="{colour}" stroke-width="2"/>"##,
        cx - r + 2.0,
        cx + r - 2.0,
        cy - r + 2.0,
        cy + r - 2.0
    );
}

/// Local `i` of `layout`, beside the others of its lane and column.
fn draw_local(svg: &mut String, layout: &Layout, i: usize, tip: &str) {
    let local = &layout.locals[i];
    let colour = colour(local.position);
    let same = |l: &&Local| l.step == local.step && l.rank == local.rank;
    let nth = layout.locals[..i].iter().filter(same).count();
    let x = column_x(local.step) + COLUMN as f64 / 2.0 + (nth as f64) * 18.0 - 8.0;
    let y = lane_y(local.rank) + 14.0;
    let kind = if local.reduce { "reduce" } else { "copy" };
    let _ = write!(
        svg,
        r#"<g class="local" data-step="{}" data-rank="{}" data-chunk="{}" data-op="{kind}"><title>step {}: rank {}: {}</title>"#,
        local.step,
        local.rank,
        local.position,
        local.step,
        local.rank,
        escape(tip)
    );
    match local.reduce {
        true => oplus(svg, x, y, 7.0, colour),
        false => {
            let _ = write!(
                svg,
                r#"<rect x="{:.1}" y="{:.1}" width="14" height="11" rx="2" fill="{colour}"/>"#,
                x - 7.0,
                y - 5.5
            );
        }
    }
    svg.push_str("</g>\n");
}

/// The legend's SVG (its top as `{Y}`, known once the lanes are drawn) and the rows it takes.
struct Legend {
    svg: String,
    rows: u32,
}

fn legend(chunks: u32, width: u32) -> Legend {
    let mut items: Vec<(String, String)> = Vec::new();
    let shown = chunks.clamp(1, PALETTE.len() as u32);
    for position in 0..shown {
        let swatch = format!(r#"<rect x="0" y="-9" width="18" height="10" rx="2" fill="{}"/>"#, colour(position));
        items.push((swatch, format!("chunk {position}")));
    }
    if chunks > PALETTE.len() as u32 {
        items.push((String::new(), format!("(colours repeat every {} chunks)", PALETTE.len())));
    }
    let mut mark = String::new();
    oplus(&mut mark, 8.0, -4.0, 7.0, "#444444");
    items.push((mark, "reducing receive / local reduce".to_string()));
    let copy = r##"<line x1="0" y1="-4" x2="12" y2="-4" stroke="#444444" stroke-width="2.5"/><polygon points="20,-4 11,-9 11,1" fill="#444444"/>"##;
    items.push((copy.to_string(), "message (stored as received)".to_string()));
    let local = r##"<rect x="1" y="-9" width="14" height="11" rx="2" fill="#444444"/>"##;
    items.push((local.to_string(), "local copy".to_string()));
    let mut svg = String::from("<g id=\"legend\" transform=\"translate(0 {Y})\">\n");
    let (mut x, mut row) = (LEFT - 60, 0u32);
    for (mark, label) in items {
        let item_width = 30 + 7 * label.chars().count() as u32 + 18;
        if x + item_width > width && x > LEFT - 60 {
            x = LEFT - 60;
            row += 1;
        }
        let y = 16 + row * LEGEND_ROW;
        let _ = writeln!(
            svg,
            r#"<g class="legend-item" transform="translate({x} {y})">{mark}<text x="26" y="0">{}</text></g>"#,
            escape(&label)
        );
        x += item_width;
    }
    svg += "</g>\n";
    Legend { svg, rows: row + 1 }
}
