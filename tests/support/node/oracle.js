// JavaScript's own answers for memstaged's differential tests (tests/support/node_oracle.py).
// One request per line on stdin, one answer per line on stdout, both JSON:
//   {"op": "<name>", "inputs": [...]}  ->  {"out": [...]}
// Bytes travel as base64. Strings may hold lone surrogates: JSON.stringify escapes them.
"use strict";
const path = require("path");
const readline = require("readline");

// SPEC 2, in the reconciler's own terms: a small JavaScript implementation of validity.
const isNonEmptyString = (v) => typeof v === "string" && v.trim() !== "";
const isObject = (v) => typeof v === "object" && v !== null && !Array.isArray(v);
function validTrigger(t) {
  if (!isObject(t)) return false;
  if (t.type === "path" || t.type === "filename" || t.type === "topic") return isNonEmptyString(t.value);
  if (t.type === "tool") return isNonEmptyString(t.value) && (!("pattern" in t) || typeof t.pattern === "string");
  if (t.type === "command") return isNonEmptyString(t.pattern);
  return false;
}
function validEvidence(e) {
  if (!isObject(e)) return false;
  let nonEmpty = false;
  if ("discussion_note_ids" in e) {
    const a = e.discussion_note_ids;
    if (!Array.isArray(a) || !a.every((n) => typeof n === "number" && Number.isFinite(n))) return false;
    nonEmpty = nonEmpty || a.length > 0;
  }
  if ("lesson_candidate_marker_ids" in e) {
    const a = e.lesson_candidate_marker_ids;
    if (!Array.isArray(a) || !a.every(isNonEmptyString)) return false;
    nonEmpty = nonEmpty || a.length > 0;
  }
  return nonEmpty;
}
function validCandidate(category, c) {
  if (!isObject(c)) return false;
  if (!validEvidence(c.source_evidence)) return false;
  if (category === "lessons")
    return isNonEmptyString(c.summary) && isNonEmptyString(c.detail) && isNonEmptyString(c.scope_suggestion)
      && Array.isArray(c.triggers) && c.triggers.length > 0 && c.triggers.every(validTrigger);
  if (category === "preferences") return isNonEmptyString(c.text);
  return isNonEmptyString(c.summary) && isNonEmptyString(c.detail);
}
function validFile(text) {
  let doc;
  try { doc = JSON.parse(text); } catch (e) { return false; }
  if (!isObject(doc)) return false;
  if (!(typeof doc.schemaVersion === "number" && doc.schemaVersion === 1)) return false;
  if (!isNonEmptyString(doc.session_id) || !isNonEmptyString(doc.project_root)) return false;
  if (!isNonEmptyString(doc.produced_at) || !Number.isFinite(Date.parse(doc.produced_at.trim()))) return false;
  if (!isObject(doc.candidates)) return false;
  for (const category of ["lessons", "preferences", "decisions", "domain"]) {
    const items = doc.candidates[category];
    if (!Array.isArray(items) || !items.every((c) => validCandidate(category, c))) return false;
  }
  return true;
}

const ops = {
  // Switch the local time zone: Node re-reads TZ when process.env.TZ is assigned.
  tz: (name) => { process.env.TZ = name; return new Date(2026, 0, 1).getTimezoneOffset(); },
  // Date.parse: the time value, or null for NaN, and its toISOString.
  date: (s) => { const v = Date.parse(s); return Number.isNaN(v) ? null : [v, new Date(v).toISOString()]; },
  utf8: (b64) => Buffer.from(b64, "base64").toString("utf-8"),
  trim: (s) => s.trim(),
  lower: (s) => s.toLowerCase(),
  length: (s) => s.length,
  basename: (s) => path.posix.basename(s),
  // SPEC 2.4 as the reconciler has it: working in `dir` (reached through links or not), the
  // root is process.cwd(); a file's project_root is its own when path.resolve(trimmed) is it.
  own: ([dir, value]) => {
    process.chdir(dir);
    const root = process.cwd();
    return [root, path.resolve(value.trim()) === root];
  },
  // JSON.parse of the bytes as fs.readFileSync(path, "utf-8") reads them: parses or not.
  parses: (b64) => { try { JSON.parse(Buffer.from(b64, "base64").toString("utf-8")); return true; } catch (e) { return false; } },
  valid: (b64) => validFile(Buffer.from(b64, "base64").toString("utf-8")),
  // The value JSON.parse reads, every number written as its exact JavaScript value ("-0" for
  // minus zero, which JSON.stringify would write as 0) and every string tagged apart from them.
  exact: (b64) => JSON.stringify(JSON.parse(Buffer.from(b64, "base64").toString("utf-8")),
    (k, v) => typeof v === "number" ? "n:" + (Object.is(v, -0) ? "-0" : String(v))
      : typeof v === "string" ? "s:" + v : v),
  // The whole-file text of SPEC 3.1's keyword topic, computed in JavaScript.
  keyword: (s) => s.toLowerCase().replace(/[`*_#>\[\](){}:;,.!?\/\\|<=+~$%^&\-0-9]+/g, " ").split(/\s+/)
    .filter((w) => w.length >= 3 && !STOP.has(w)).slice(0, 4).join(" "),
};
const STOP = new Set("the and for with from that this when then into should must have has are was were use using".split(" "));

const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on("line", (line) => {
  const req = JSON.parse(line);
  const op = ops[req.op];
  process.stdout.write(JSON.stringify({ out: req.inputs.map(op) }) + "\n");
});
