//! The layout as a self-contained page that steps through the schedule: the SVG inline, Prev/Next (and the arrow
//! keys) moving a highlighted column, and every rank's buffers after that column, simulated in Rust and embedded as
//! JSON. No network: the script and styles are inline.

use super::contents::Contents;
use super::layout::Layout;
use super::svg::escape;
use collc_compiler::sched::BufId;
use collc_compiler::VerifiedSchedule;
use serde_json::json;
use std::collections::HashMap;
use std::fmt::Write;

const STYLE: &str = r#"
body { font-family: "DejaVu Sans", Helvetica, Arial, sans-serif; margin: 18px; color: #202124; }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 18px 0 6px; }
p.summary { margin: 0 0 10px; color: #5f6368; }
#controls { margin: 8px 0; display: flex; gap: 12px; align-items: center; }
#controls button { font-size: 14px; padding: 4px 14px; }
#step-counter { font-weight: bold; min-width: 10em; }
#picture { overflow-x: auto; border: 1px solid #dadce0; display: inline-block; max-width: 100%; }
.column.current { fill: #ffe8a3; }
.step-label.current { fill: #b06000; }
.arrow, .local { transition: opacity 0.15s; }
.arrow.future, .local.future { opacity: 0.2; }
.arrow.past, .local.past { opacity: 0.5; }
.arrow.current line { stroke-width: 4; }
table.buffer { border-collapse: collapse; margin: 0 0 12px; font-size: 13px; }
table.buffer th, table.buffer td { border: 1px solid #dadce0; padding: 3px 8px; text-align: left; white-space: nowrap; }
table.buffer caption { text-align: left; font-weight: bold; padding: 2px 0; }
td.cell { font-family: "DejaVu Sans Mono", monospace; min-width: 3em; white-space: nowrap; }
td.cell.changed { background: #ffe8a3; }
li.message { font-family: "DejaVu Sans Mono", monospace; font-size: 13px; }
"#;

const SCRIPT: &str = r#"
(function () {
  const data = JSON.parse(document.getElementById('viz-data').textContent);
  const root = document.getElementById('viz');
  const counter = document.getElementById('step-counter');
  const prev = document.getElementById('prev');
  const next = document.getElementById('next');
  const cells = Array.from(document.querySelectorAll('.cell'));
  const marks = Array.from(document.querySelectorAll('.column, .step-label, .arrow, .local'));
  const list = document.getElementById('messages');
  let position = 0;
  function show(p) {
    position = Math.max(0, Math.min(data.n_steps, p));
    const step = position - 1;
    root.dataset.position = String(position);
    root.dataset.step = String(step);
    counter.textContent = position === 0 ? 'start: the inputs'
      : 'step ' + step + ' (' + position + ' of ' + data.n_steps + ')';
    for (const mark of marks) {
      // At the start every step is drawn alike, as in the SVG.
      const s = position === 0 ? step : Number(mark.dataset.step);
      mark.classList.toggle('current', position > 0 && s === step);
      mark.classList.toggle('past', s < step);
      mark.classList.toggle('future', s > step);
    }
    const now = data.states[position];
    const before = data.states[Math.max(0, position - 1)];
    for (const cell of cells) {
      const slot = Number(cell.dataset.slot);
      cell.textContent = data.strings[now[slot]];
      cell.classList.toggle('changed', position > 0 && now[slot] !== before[slot]);
    }
    const sent = data.messages.filter(function (m) { return m[0] === step; });
    list.replaceChildren.apply(list, sent.map(function (m) {
      const item = document.createElement('li');
      item.className = 'message';
      item.textContent = 'rank ' + m[1] + ' \u2192 rank ' + m[2] + ': ' + m[3];
      return item;
    }));
    document.getElementById('no-messages').hidden = sent.length > 0;
    prev.disabled = position === 0;
    next.disabled = position === data.n_steps;
  }
  prev.addEventListener('click', function () { show(position - 1); });
  next.addEventListener('click', function () { show(position + 1); });
  document.addEventListener('keydown', function (e) {
    if (e.key === 'ArrowRight') { show(position + 1); } else if (e.key === 'ArrowLeft') { show(position - 1); } else { return; }
    e.preventDefault();
  });
  // `page.html#step=K` opens after step K (a link to one step, or a screenshot of it).
  const asked = /step=(\d+)/.exec(window.location.hash);
  show(asked ? Number(asked[1]) + 1 : 0);
})();
"#;

/// The page: `svg` (the picture `svg::render` made for `layout`) and the buffers `contents` holds at each step.
pub fn render(verified: &VerifiedSchedule, layout: &Layout, contents: &Contents, title: &str, svg: &str) -> String {
    let sched = verified.schedule();
    let shown = shown_buffers(verified);
    let (strings, states) = cell_texts(verified, contents, &shown);
    let messages: Vec<_> = (layout.arrows.iter().enumerate())
        .map(|(i, a)| json!([a.step, a.from, a.to, contents.message_text(i)]))
        .collect();
    let data = json!({ "n_steps": layout.n_steps, "strings": strings, "states": states, "messages": messages });
    // Inside <script>, `</` would end the element.
    let data = data.to_string().replace("</", "<\\/");

    let mut page = String::new();
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>collc viz: {t}</title>\n\
         <style>{STYLE}</style>\n</head>\n<body>\n<main id=\"viz\" data-position=\"0\" data-step=\"-1\" data-steps=\"{n}\">\n\
         <h1>{t}</h1>\n<p class=\"summary\">{collective}, {placement}: {messages} messages in {n} steps. Columns are the \
         rounds the dataflow allows; an arrow is a message, coloured by its chunk; ⊕ marks a receive that reduces. \
         Step with the buttons or the ← → keys.</p>\n",
        t = escape(title),
        n = layout.n_steps,
        collective = sched.collective,
        placement = sched.placement.name(),
        messages = layout.arrows.len(),
    );
    page += "<div id=\"controls\"><button id=\"prev\" type=\"button\">◀ Prev</button>\
             <span id=\"step-counter\">start: the inputs</span>\
             <button id=\"next\" type=\"button\">Next ▶</button></div>\n";
    let _ = writeln!(page, "<div id=\"picture\">\n{svg}</div>");
    page +=
        "<h2>Buffers after this step</h2>\n<p class=\"summary\">rK.cI is rank K's input chunk I; a sum lists every \
             contribution; · is undefined data.</p>\n";
    let mut slot = 0;
    for &buf in &shown {
        page += &buffer_table(verified, buf, &states[0], &strings, &mut slot);
    }
    page += "<h2>Messages sent in this step</h2>\n<p id=\"no-messages\" class=\"summary\">none</p>\n<ul id=\"messages\"></ul>\n";
    let _ = write!(
        page,
        "</main>\n<script type=\"application/json\" id=\"viz-data\">{data}</script>\n<script>{SCRIPT}</script>\n</body>\n</html>\n"
    );
    page
}

/// Every cell's text at every step, each distinct text once: (the texts, per step the index of each cell's text).
/// Cells go in page order, buffer by buffer, rank by rank, chunk by chunk; a cell's `data-slot` is its place here.
fn cell_texts(verified: &VerifiedSchedule, contents: &Contents, shown: &[BufId]) -> (Vec<String>, Vec<Vec<usize>>) {
    let mut slots = Vec::new();
    for &buf in shown {
        for rank in 0..verified.n_ranks {
            slots.extend((0..verified.buffer(buf).chunks).map(|chunk| contents.slot(rank, buf, chunk)));
        }
    }
    let mut strings: Vec<String> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut intern = |text: String| {
        *index.entry(text).or_insert_with_key(|text| {
            strings.push(text.clone());
            strings.len() - 1
        })
    };
    let states = contents.states.iter().map(|state| slots.iter().map(|&s| intern(state[s].text())).collect()).collect();
    (strings, states)
}

/// The buffers a reader needs to see: the input's and output's (in place, the one they share) and every scratch
/// buffer an instruction names.
fn shown_buffers(verified: &VerifiedSchedule) -> Vec<BufId> {
    let sched = verified.schedule();
    let mut shown = vec![sched.input_window(0).0, sched.output_window(0).0];
    for instr in sched.ranks.iter().flat_map(|p| &p.instrs) {
        shown.extend(instr.reads().chain(instr.dst.get()).map(|o| o.buf));
    }
    shown.sort();
    shown.dedup();
    shown
}

/// One buffer's table: a row per rank, a column per chunk, each cell showing state 0 (the inputs) until the script
/// takes over. `slot` counts cells in page order.
fn buffer_table(
    verified: &VerifiedSchedule,
    buf: BufId,
    first: &[usize],
    strings: &[String],
    slot: &mut usize,
) -> String {
    let sched = verified.schedule();
    let name = escape(&sched.buffer(buf).name);
    let chunks = sched.buffer(buf).chunks;
    let mut table = format!("<table class=\"buffer\" data-buf=\"{name}\">\n<caption>{name}</caption>\n<tr><th></th>");
    for chunk in 0..chunks {
        let _ = write!(table, "<th>{name}[{chunk}]</th>");
    }
    table += "</tr>\n";
    for rank in 0..sched.n_ranks {
        let _ = write!(table, "<tr><th>rank {rank}</th>");
        for chunk in 0..chunks {
            let text = escape(&strings[first[*slot]]);
            let _ = write!(
                table,
                "<td class=\"cell\" data-rank=\"{rank}\" data-buf=\"{name}\" data-chunk=\"{chunk}\" data-slot=\"{slot}\">{text}</td>"
            );
            *slot += 1;
        }
        table += "</tr>\n";
    }
    table + "</table>\n"
}
