// Lint: typescript-eslint's recommended rules, plus the type-aware promise rules that matter
// in a runtime built of timers, sockets and fire-and-forget loops. Formatting is Prettier's.
import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["dist/", "**/dist/", "node_modules/", "bench/results/", "chaos/results/", ".leasehold/", ".scratch/", "test/doc-samples/generated/"] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: {
      parserOptions: { project: ["./tsconfig.check.json", "./packages/cli/dashboard/tsconfig.json"], tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      "@typescript-eslint/no-floating-promises": [
        "error",
        // node:test's test() returns a promise the runner itself awaits.
        { allowForKnownSafeCalls: [{ from: "package", package: "node:test", name: ["test", "it", "describe", "suite"] }] },
      ],
      "@typescript-eslint/no-misused-promises": ["error", { checksVoidReturn: false }],
      "@typescript-eslint/await-thenable": "error",
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_", caughtErrors: "none" }],
      // Handlers take user payloads of any shape; `any` is the honest type at that boundary.
      "@typescript-eslint/no-explicit-any": "off",
      "no-constant-condition": ["error", { checkLoops: false }],
    },
  },
  {
    files: ["**/*.js", "**/*.mjs"],
    ...tseslint.configs.disableTypeChecked,
  },
  {
    // A project of its own, type-checked by its own tsc against the installed package.
    files: ["examples/testing-app/**"],
    ...tseslint.configs.disableTypeChecked,
  },
  {
    // Checked by tsc with the docs' fragments (test/doc-samples/tsconfig.fragments.json), outside the main project.
    files: ["test/doc-samples/fragment-globals.d.ts"],
    ...tseslint.configs.disableTypeChecked,
  },
);
