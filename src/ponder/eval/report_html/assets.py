"""The report page's CSS and script, inlined into every report (no network, no CDN).

The script reads the episodes from the page's JSON block and builds the browser with
createElement and textContent only: no string of the data ever becomes markup.
"""

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; padding: 0 1em;
       color: #1d2329; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #d0d7de; }
table.numbers { border-collapse: collapse; font-variant-numeric: tabular-nums; }
table.numbers th, table.numbers td { padding: 2px 10px; border-bottom: 1px solid #eaeef2; }
table.numbers td { text-align: right; } table.numbers tbody th { text-align: left; font-weight: normal; }
td.delta { color: #57606a; }
.note { color: #57606a; font-size: 0.92em; } .gain { font-weight: 600; }
.figures { display: flex; flex-wrap: wrap; gap: 6px; } .figures figure { margin: 0; } .figures img { max-width: 100%; }
.browser { display: flex; gap: 16px; align-items: flex-start; }
.pick { flex: 0 0 260px; display: flex; flex-direction: column; gap: 6px; }
.pick select { width: 100%; }
#episode { flex: 1; min-width: 0; }
.turn { border: 1px solid #d0d7de; border-radius: 6px; margin: 8px 0; padding: 6px 8px; }
.turn-head { font-weight: 600; margin-bottom: 4px; }
pre.tokens, pre.prompt { white-space: pre-wrap; word-break: break-word; margin: 4px 0;
                         font: 12.5px/1.5 ui-monospace, monospace; }
.tok.trained { background: #ddf4e4; } .tok.trained.odd { background: #c2ead0; }
.tok.observation { background: #e8eaf6; color: #4a4f6a; } .tok.observation.odd { background: #d9dcf0; }
.legend .tok { padding: 1px 4px; font-size: 0.85em; }
table.kv td, table.kv th { padding: 1px 8px; text-align: left; font-weight: normal; }
.error { color: #b42318; }
"""

SCRIPT = r"""
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("ponder-data").textContent);
  const runSelect = document.getElementById("run-select");
  const stageSelect = document.getElementById("stage-select");
  const episodeSelect = document.getElementById("episode-select");
  const view = document.getElementById("episode");
  if (!stageSelect || !data.runs.length) return;

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }
  function num(value, digits) { return value === null || value === undefined ? "-" : value.toFixed(digits); }
  function option(select, value, text) { const o = el("option", text); o.value = value; select.appendChild(o); }
  function run() { return data.runs[Number(runSelect.value || 0)]; }
  function keyValues(title, values) {
    const table = el("table", null, "kv");
    table.id = title;
    for (const [key, value] of Object.entries(values)) {
      const row = el("tr");
      row.appendChild(el("th", key));
      row.appendChild(el("td", typeof value === "number" ? num(value, 3) : value === null ? "-" : value));
      table.appendChild(row);
    }
    return table;
  }

  function fillStages() {
    stageSelect.textContent = "";
    for (const stage of Object.keys(run().episodes)) option(stageSelect, stage, run().labels[stage] || stage);
    fillEpisodes();
  }
  function fillEpisodes() {
    episodeSelect.textContent = "";
    const episodes = run().episodes[stageSelect.value] || [];
    episodes.forEach((episode, i) => option(episodeSelect, i, episode.task_id + " · " + num(episode.reward, 2) +
      (episode.step_score === undefined ? "" : " · steps " + num(episode.step_score, 2))));
    const tokens = run().tokens === "token";
    document.getElementById("token-note").textContent = tokens
      ? "Pieces are the run's tokens, decoded one by one with its tokenizer."
      : "The run's tokenizer is not on this machine: each turn shows its stored text, split by the same mask.";
    if (episodes.length) { episodeSelect.value = "0"; show(); } else { view.textContent = ""; }
  }

  function turnView(turn) {
    const box = el("div", null, "turn");
    box.dataset.turn = turn.index;
    let head = "turn " + turn.index;
    if (turn.reward !== null) head += " · reward " + num(turn.reward, 3);
    if (turn.problems !== undefined) head += turn.problems.length ? " · bad step" : " · good step";
    box.appendChild(el("div", head, "turn-head"));
    if (turn.problems && turn.problems.length) {
      box.appendChild(el("div", "step problems: " + turn.problems.join(", "), "error problems"));
    }
    for (const call of turn.tool_calls) box.appendChild(el("div", "tool call: " + call.name + " " + call.arguments, "call"));
    for (const result of turn.tool_results) {
      if (result.is_error) box.appendChild(el("div", "tool error from " + result.name, "error"));
    }
    if (turn.error) box.appendChild(el("div", "error: " + turn.error, "error"));
    const pre = el("pre", null, "tokens");
    turn.pieces.forEach((piece, i) => {
      const kind = turn.mask[i] === "1" ? "trained" : "observation";
      pre.appendChild(el("span", piece, "tok " + kind + (i % 2 ? " odd" : "")));
    });
    box.appendChild(pre);
    if (turn.answer !== null) box.appendChild(el("div", "answer: " + turn.answer, "answer"));
    return box;
  }

  function show() {
    const episode = (run().episodes[stageSelect.value] || [])[Number(episodeSelect.value)];
    view.textContent = "";
    if (!episode) return;
    view.appendChild(el("h3", episode.task_id));
    view.appendChild(el("p", "reward " + num(episode.reward, 3) + " · stop: " + (episode.stop_reason || "-") +
      " · trained tokens " + episode.trained_tokens + " · masked tokens " + episode.masked_tokens, "headline"));
    if (episode.step_score !== undefined) {
      view.appendChild(el("p", "step score " + num(episode.step_score, 3) + " · first bad step " +
        (episode.first_bad === null ? "none" : episode.first_bad) +
        " (answer guessing, which needs the task's gold answer, is not judged here)", "steps"));
    }
    view.appendChild(el("h4", "reward breakdown"));
    view.appendChild(keyValues("breakdown", episode.breakdown));
    if (episode.prompt !== null) {
      const details = el("details");
      details.appendChild(el("summary", "prompt"));
      details.appendChild(el("pre", episode.prompt, "prompt"));
      view.appendChild(details);
    }
    for (const turn of episode.turns) view.appendChild(turnView(turn));
    const details = el("details");
    details.appendChild(el("summary", "episode metrics"));
    details.appendChild(keyValues("episode-metrics", episode.metrics));
    view.appendChild(details);
  }

  if (data.runs.length > 1) {
    document.getElementById("run-label").hidden = false;
    data.runs.forEach((r, i) => option(runSelect, i, r.name));
  }
  runSelect.addEventListener("change", fillStages);
  stageSelect.addEventListener("change", fillEpisodes);
  episodeSelect.addEventListener("change", show);
  fillStages();
})();
"""
