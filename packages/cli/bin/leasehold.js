#!/usr/bin/env node
// The `leasehold` command: the compiled CLI. A file of its own, so that npm can link the bin in a
// fresh clone's first `npm install`, before `prepare` has built dist/.
import "../dist/cli/main.js";
