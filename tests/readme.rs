//! The README's quick start shows `examples/quickstart`'s projection and its test as they are
//! (that crate is built and tested from outside the workspace by `scripts/quickstart.sh`).

#[test]
fn the_readme_shows_the_quick_start_files_as_they_are() {
    let readme = include_str!("../README.md");
    for file in ["src/lib.rs", "tests/accounts.rs"] {
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

/// Every relative link of the README and of docs/ names a file that exists and, with a
/// `#fragment`, a heading of it (as GitHub makes a heading's anchor): pages moved or
/// sections renamed leave no dead link.
#[test]
fn the_docs_links_lead_somewhere() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    let mut dead = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() { page.clone() } else { page.parent().unwrap().join(file) };
            if !target.exists() {
                dead.push(format!("{}: {link} (no such file)", page.display()));
                continue;
            }
            // A directory or an image: there, and no headings to check.
            let target_text = std::fs::read_to_string(&target).unwrap_or_default();
            if !fragment.is_empty() && !anchors(&target_text).iter().any(|a| a == fragment) {
                dead.push(format!("{}: {link} (no such heading)", page.display()));
            }
        }
    }
    assert!(checked > 20, "only {checked} links found: the link pattern is broken");
    assert!(dead.is_empty(), "dead links:\n{}", dead.join("\n"));
}

/// The targets of `[text](target)` links outside code blocks.
fn links(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    out
}

/// The anchors GitHub gives a page's headings: lower case, punctuation but `-` and `_`
/// dropped, spaces as `-`.
fn anchors(markdown: &str) -> Vec<String> {
    let mut in_code = false;
    let mut out = Vec::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        }
        if in_code || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        out.push(slug);
    }
    out
}
