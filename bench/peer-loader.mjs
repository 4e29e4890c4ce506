// BENCHMARK PEER, written for the memstaged project (issue 14). It is NOT the agent's loader:
// the project cannot contain the agent's code. It is a small, independent Node 20 implementation
// of SPEC sections 2-4 (/work/shared/SPEC.md, version 2), doing what the agent's loader does when
// the reconciler runs, so that `make bench` can time memstaged --once against a JavaScript peer
// doing the same work:
//
// - read every staging file of one memory dir: fs.readFileSync, decoded as utf-8 (invalid bytes
//   become U+FFFD, a byte-order mark stays), JSON.parse;
// - validate it per SPEC 2 (String.prototype.trim, typeof "number", Date.parse of produced_at);
// - leave valid files and other projects' files (SPEC 2.4) untouched;
// - repair R1 (SPEC 3: derived topic triggers, 3.1) and rewrite the file;
// - dead-letter every other file (SPEC 4: the original bytes in deadletter/originals/, one record
//   per candidate, or one record for the whole file), then remove it from staging/;
// - every write goes to a temp file in the same directory and is renamed into place, with no
//   fsync, as the agent's loader does. Records are compact JSON (one line each), rewritten
//   staging files indented by two spaces. There are no locks, no settle interval and no other
//   repair: it is a speed peer, not a second memstaged.
//
// Usage: node bench/peer-loader.mjs MEMORY_DIR [--project-root DIR]
// Prints one JSON object: {"valid": n, "repaired": n, "quarantined": n, "foreign": n,
// "skipped": n, "records": n}.

import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";

const CATEGORIES = ["lessons", "preferences", "decisions", "domain"];
const GATE_REASON = "malformed staging file";
const EPOCH = "1970-01-01T00:00:00.000Z";
const CONTEXT_KEYS = ["topic", "project", "projectName", "name", "title", "repository", "repo", "scope"];
const PATH_KEYS = ["project_root", "projectRoot", "root", "cwd"];
const STOP_WORDS = new Set(
  "the and for with from that this when then into should must have has are was were use using".split(" "),
);
const PUNCTUATION = /[`*_#>[\](){}:;,.!?/\\|<=+~$%^&\-0-9]+/g;

// ------------------------------------------------------------------------------------ SPEC 2
const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const nonEmpty = (v) => typeof v === "string" && v.trim() !== "";
const isTimestamp = (v) => nonEmpty(v) && Number.isFinite(Date.parse(v.trim()));

function triggerErrors(t, at, out) {
  if (!isObject(t)) return out.push(`${at}: not an object`);
  switch (t.type) {
    case "path":
    case "filename":
    case "topic":
      if (!nonEmpty(t.value)) out.push(`${at}.value: not a non-empty string`);
      return;
    case "tool":
      if (!nonEmpty(t.value)) out.push(`${at}.value: not a non-empty string`);
      if (Object.hasOwn(t, "pattern") && typeof t.pattern !== "string") out.push(`${at}.pattern: not a string`);
      return;
    case "command":
      if (!nonEmpty(t.pattern)) out.push(`${at}.pattern: not a non-empty string`);
      return;
    default:
      out.push(`${at}.type: not a trigger type`);
  }
}

function evidenceErrors(e, at, out) {
  if (!isObject(e)) return out.push(`${at}: not an object`);
  let some = false;
  if (Object.hasOwn(e, "discussion_note_ids")) {
    const ids = e.discussion_note_ids;
    if (!Array.isArray(ids) || !ids.every(Number.isFinite)) out.push(`${at}.discussion_note_ids: not an array of finite numbers`);
    else some ||= ids.length > 0;
  }
  if (Object.hasOwn(e, "lesson_candidate_marker_ids")) {
    const ids = e.lesson_candidate_marker_ids;
    if (!Array.isArray(ids) || !ids.every(nonEmpty)) out.push(`${at}.lesson_candidate_marker_ids: not an array of non-empty strings`);
    else some ||= ids.length > 0;
  }
  if (!some) out.push(`${at}: no non-empty id array`);
}

const STRINGS = {
  lessons: ["summary", "detail", "scope_suggestion"],
  preferences: ["text"],
  decisions: ["summary", "detail"],
  domain: ["summary", "detail"],
};

// The errors of one candidate; `withTriggers` false checks a lesson "otherwise" (R1).
function candidateErrors(category, c, at, withTriggers = true) {
  const out = [];
  if (!isObject(c)) return [`${at}: not an object`];
  for (const key of STRINGS[category]) if (!nonEmpty(c[key])) out.push(`${at}.${key}: not a non-empty string`);
  if (category === "lessons" && withTriggers) {
    if (!Array.isArray(c.triggers) || c.triggers.length === 0) out.push(`${at}.triggers: not a non-empty array`);
    else c.triggers.forEach((t, i) => triggerErrors(t, `${at}.triggers[${i}]`, out));
  }
  evidenceErrors(c.source_evidence, `${at}.source_evidence`, out);
  return out;
}

// {file: [...], candidates: Map("category:i" -> [...])}: file-level and per-candidate errors.
function validate(doc) {
  const file = [];
  const candidates = new Map();
  if (!isObject(doc)) return { file: ["$: not an object"], candidates, count: 1 };
  if (doc.schemaVersion !== 1) file.push("schemaVersion: not the number 1");
  if (!nonEmpty(doc.session_id)) file.push("session_id: not a non-empty string");
  if (!nonEmpty(doc.project_root)) file.push("project_root: not a non-empty string");
  if (!isTimestamp(doc.produced_at)) file.push("produced_at: not a timestamp");
  let count = file.length;
  const cands = doc.candidates;
  if (!isObject(cands)) {
    file.push("candidates: not an object");
    return { file, candidates, count: count + 1 };
  }
  for (const category of CATEGORIES) {
    const items = cands[category];
    if (!Array.isArray(items)) {
      file.push(`candidates.${category}: not an array`);
      count += 1;
      continue;
    }
    items.forEach((c, i) => {
      const errors = candidateErrors(category, c, `candidates.${category}[${i}]`);
      if (errors.length) {
        candidates.set(`${category}:${i}`, errors);
        count += errors.length;
      }
    });
  }
  return { file, candidates, count };
}

// ------------------------------------------------------------------------------------ SPEC 2.4
function isForeign(doc, projectRoot) {
  if (!isObject(doc) || !nonEmpty(doc.project_root)) return false;
  return path.posix.resolve(projectRoot, doc.project_root.trim()) !== projectRoot;
}

// ------------------------------------------------------------------------------------ SPEC 3
const collapse = (s) => s.replace(/\s+/g, " ").trim();

function keywordTopic(text) {
  const words = text.toLowerCase().replace(PUNCTUATION, " ").split(/\s+/);
  return words.filter((w) => w.length >= 3 && !STOP_WORDS.has(w)).slice(0, 4).join(" ");
}

// SPEC 3.1: the topic of a derived trigger.
function topicOf(doc, lesson) {
  for (const key of CONTEXT_KEYS) {
    const v = doc[key];
    if (typeof v === "string" && collapse(v)) return collapse(v);
  }
  for (const key of PATH_KEYS) {
    const v = doc[key];
    if (typeof v === "string" && collapse(path.posix.basename(v))) return collapse(path.posix.basename(v));
  }
  const text = `${lesson.summary}\n${lesson.detail}`;
  for (const t of [lesson.scope_suggestion, keywordTopic(text), text]) {
    if (typeof t === "string" && collapse(t)) return collapse(t);
  }
  return "lesson";
}

// R1 on a copy of doc: the repaired document, or null when R1 does not make it valid.
function repairR1(doc, problems) {
  if (problems.file.length || problems.candidates.size === 0) return null;
  const lessons = doc.candidates.lessons;
  const fixed = structuredClone(doc);
  for (const key of problems.candidates.keys()) {
    const [category, i] = key.split(":");
    const lesson = lessons[Number(i)];
    const t = isObject(lesson) ? lesson.triggers : undefined;
    const bare = !Array.isArray(t) || t.length === 0;
    if (category !== "lessons" || !bare) return null;
    if (candidateErrors(category, lesson, "", false).length) return null;
    fixed.candidates.lessons[Number(i)].triggers = [{ type: "topic", value: topicOf(doc, lesson) }];
  }
  return fixed;
}

// ------------------------------------------------------------------------------------ SPEC 4
const stem = (name) => (name.endsWith(".json") ? name.slice(0, -5) : name);
const safe = (text) => text.replace(/[^A-Za-z0-9._-]+/g, "_").replace(/^[.-]+/, "").slice(0, 80) || "file";

let tempCounter = 0;
function writeReplacing(dir, name, data) {
  const tmp = path.join(dir, `.peer-loader-${process.pid}-${tempCounter++}.tmp`);
  fs.writeFileSync(tmp, data, { mode: 0o600 });
  fs.renameSync(tmp, path.join(dir, name));
}

function quarantine(memoryDir, name, bytes, text, doc, parsed) {
  const deadletter = path.join(memoryDir, "deadletter");
  const originals = path.join(deadletter, "originals");
  fs.mkdirSync(originals, { recursive: true, mode: 0o700 });
  const sha = createHash("sha256").update(bytes).digest("hex");
  const prefix = `${safe(stem(name))}-${sha.slice(0, 16)}`;
  writeReplacing(originals, `${safe(name)}.${sha.slice(0, 16)}.orig`, bytes);
  const top = parsed && isObject(doc) ? doc : {};
  const sessionId = nonEmpty(top.session_id) ? top.session_id.trim() : `malformed-${stem(name)}`;
  const producedAt = isTimestamp(top.produced_at)
    ? new Date(Date.parse(top.produced_at.trim())).toISOString()
    : EPOCH;
  const record = (category, candidate, attempts) =>
    JSON.stringify(
      { session_id: sessionId, produced_at: producedAt, attempts, last_gate_reason: GATE_REASON, category, candidate },
    );
  let written = 0;
  const cands = parsed && isObject(doc) ? doc.candidates : undefined;
  const lists = isObject(cands) ? CATEGORIES.filter((c) => Array.isArray(cands[c])) : [];
  const total = lists.reduce((n, c) => n + cands[c].length, 0);
  if (total === 0) {
    writeReplacing(deadletter, `${prefix}-file.json`, record("lessons", parsed ? doc : text, 0));
    written = 1;
  } else {
    // Bounded records (SPEC 4): past 16x the file's size or 64 MiB, refer to the original.
    const embed = total * text.length <= Math.max(16 * bytes.length, 64 * 2 ** 20);
    const original = embed ? doc : { memstaged_original: `${safe(name)}.${sha.slice(0, 16)}.orig`, sha256: sha };
    for (const category of lists) {
      cands[category].forEach((c, i) => {
        const attempts = isObject(c) && Number.isFinite(c.reconcile_attempts) ? c.reconcile_attempts : 0;
        const body = record(category, { candidate: c, original_staging_file: original }, attempts);
        writeReplacing(deadletter, `${prefix}-${category}-${i}.json`, body);
        written += 1;
      });
    }
  }
  fs.unlinkSync(path.join(memoryDir, "staging", name));
  return written;
}

// ------------------------------------------------------------------------------------ main
function main(argv) {
  const memoryDir = path.resolve(argv[0]);
  const at = argv.indexOf("--project-root");
  const projectRoot = at >= 0 ? path.resolve(argv[at + 1]) : path.resolve(memoryDir, "..", "..", "..");
  const staging = path.join(memoryDir, "staging");
  const counts = { valid: 0, repaired: 0, quarantined: 0, foreign: 0, skipped: 0, records: 0 };
  const entries = fs.readdirSync(staging, { withFileTypes: true });
  entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const entry of entries) {
    const name = entry.name;
    if (!name.endsWith(".json") || name.startsWith(".") || !entry.isFile()) {
      counts.skipped += 1;
      continue;
    }
    const bytes = fs.readFileSync(path.join(staging, name));
    const text = bytes.toString("utf-8"); // what fs.readFileSync(path, "utf-8") returns
    let doc;
    let parsed = true;
    try {
      doc = JSON.parse(text);
    } catch {
      parsed = false;
    }
    if (parsed && isForeign(doc, projectRoot)) {
      counts.foreign += 1;
      continue;
    }
    const problems = parsed ? validate(doc) : null;
    if (problems && problems.count === 0) {
      counts.valid += 1;
      continue;
    }
    const fixed = problems ? repairR1(doc, problems) : null;
    if (fixed && validate(fixed).count === 0) {
      writeReplacing(staging, name, `${JSON.stringify(fixed, null, 2)}\n`);
      counts.repaired += 1;
      continue;
    }
    counts.records += quarantine(memoryDir, name, bytes, text, doc, parsed);
    counts.quarantined += 1;
  }
  process.stdout.write(`${JSON.stringify(counts)}\n`);
}

main(process.argv.slice(2));
