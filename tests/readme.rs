//! The README's quick start is `examples/quickstart`, file for file (that crate is built and
//! tested from outside the workspace by `scripts/quickstart.sh`).

#[test]
fn the_readme_shows_the_quick_start_files_as_they_are() {
    let readme = include_str!("../README.md");
    for file in ["Cargo.toml", "src/lib.rs", "src/main.rs", "tests/accounts.rs"] {
        let path = format!("{}/examples/quickstart/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let marker = format!("`examples/quickstart/{file}`:");
        let at = readme.find(&marker).unwrap_or_else(|| panic!("the README shows {marker}"));
        let fence = at + readme[at..].find("```").expect("a code block after the file's name");
        let body = fence + readme[fence..].find('\n').unwrap() + 1;
        let end = body + readme[body..].find("```").expect("the block's end");
        assert_eq!(&readme[body..end], text, "the README's {file} differs from examples/quickstart/{file}");
    }
}
