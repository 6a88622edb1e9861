// prepack of each package: carries the root CHANGELOG.md in its tarball (npm pack skips
// symlinks, and files outside the package). Written under a temporary name and renamed, so a
// pack of the same package running at the same time never reads half a file.
import fs from "node:fs";
import process from "node:process";

const temporary = `.CHANGELOG.md.${process.pid}`;
fs.copyFileSync("../../CHANGELOG.md", temporary);
fs.renameSync(temporary, "CHANGELOG.md");
