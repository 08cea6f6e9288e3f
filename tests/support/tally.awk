# The test command's closing tally, from `cargo test`'s output (and the
# skips recorded by tests/support/skip.rs, the file given as `skips=`):
# passed, failed and skipped over every test binary, and every skipped
# test by name. A test that returned early because it cannot run here is
# counted skipped, not passed; an #[ignore]d test is listed with its reason.
#
#   awk -v skips=FILE -f tests/support/tally.awk LOG
BEGIN { binary = "?" }
# "Running tests/e2e/main.rs (.../deps/e2e-0123abcd)": the binary, unhashed.
/^ +Running / { binary = $NF; sub(/^.*\//, "", binary); sub(/-[0-9a-f]+\)$/, "", binary) }
/^ +Doc-tests / { binary = "doc-tests " $2 }
/^test result:/ { p += $4; f += $6; s += $8 }
/^test .* \.\.\. ignored/ {
    name = $2
    why = $0
    sub(/^.* \.\.\. ignored,? ?/, "", why)
    ignored[++n] = name " (" binary (why == "" ? "" : ": " why) ")"
}
END {
    early = 0
    if (skips != "") {
        while ((getline line < skips) > 0) {
            split(line, part, "\t")
            returned[++early] = part[1] " (" part[2] ")"
        }
    }
    printf "%d passed, %d failed, %d skipped\n", p - early, f, s + early
    for (i = 1; i <= n; i++) print "  skipped: " ignored[i]
    for (i = 1; i <= early; i++) print "  skipped: " returned[i]
}
