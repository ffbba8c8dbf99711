// Renders chat templates with @huggingface/jinja for the drift explorer (engine/render/runtimes.py starts it, off the
// network). One JSON request per line on stdin, one JSON reply per line on stdout:
//   {"key": "<sha256 of the source>", "source": "<template>" (the first time a key is sent), "contexts": [{...}, ...]}
//   -> {"results": [{"text": "..."} | {"error": "..."}, ...]}   or {"error": "..."} for the whole request.
// The package is loaded from the folder DRIFT_HFJS_DIR names (npm ci of this folder's package-lock.json there).
import { createRequire } from "node:module";
import { createInterface } from "node:readline";

const require = createRequire(`${process.env.DRIFT_HFJS_DIR}/package.json`);
const { Template } = require("@huggingface/jinja");
const templates = new Map();

function message(error) {
  return String((error && error.message) || error);
}

for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
  let reply;
  try {
    const request = JSON.parse(line);
    let template = templates.get(request.key);
    if (template === undefined) {
      if (typeof request.source !== "string") throw new Error("no template source for this key");
      template = new Template(request.source);
      templates.set(request.key, template);
    }
    reply = {
      results: request.contexts.map((context) => {
        try {
          return { text: template.render(context) };
        } catch (error) {
          return { error: message(error) };
        }
      }),
    };
  } catch (error) {
    reply = { error: message(error) };
  }
  process.stdout.write(`${JSON.stringify(reply)}\n`);
}
