// Preloaded into a CLI process (NODE_OPTIONS=--import): counts its writes to stdout and says
// how many on stderr at exit, so a test can tell lines written together from one write each.
import process from "node:process";

let writes = 0;
const write = process.stdout.write.bind(process.stdout);
process.stdout.write = (...args) => {
  writes++;
  return write(...args);
};
process.on("exit", () => process.stderr.write(`stdout writes: ${writes}\n`));
