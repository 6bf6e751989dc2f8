//! docs/writing-a-service.md walks through this service quoting its files: every block that
//! follows a line naming a file (`From \`path\`:`) must be in that file word for word, so the
//! guide shows compiled, tested code.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// (file, quoted block) for every fenced block whose introducing line ends with
/// ``From `<file>`:`` (the file may be named on the line before).
fn quotes(guide: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = guide.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].starts_with("```") && lines[i].len() > 3 {
            let intro = lines[..i]
                .iter()
                .rev()
                .skip_while(|l| l.trim().is_empty())
                .take(2)
                .copied()
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join(" ");
            let end = (i + 1..lines.len())
                .find(|&j| lines[j] == "```")
                .expect("a closed block");
            let named = intro
                .rsplit("From ")
                .next()
                .filter(|_| intro.contains("From ") && intro.ends_with("`:"))
                .and_then(|rest| rest.split('`').nth(1));
            if let Some(file) = named {
                found.push((file.to_owned(), lines[i + 1..end].join("\n")));
            }
            i = end;
        }
        i += 1;
    }
    found
}

#[test]
fn the_guide_quotes_the_search_service_word_for_word() {
    let guide = std::fs::read_to_string(repo().join("docs/writing-a-service.md")).expect("guide");
    let quotes = quotes(&guide);
    assert!(quotes.len() >= 11, "the walk-through's quotes: {quotes:#?}");
    for (file, block) in quotes {
        let text = std::fs::read_to_string(repo().join(&file))
            .unwrap_or_else(|e| panic!("{file}, quoted by the guide: {e}"));
        assert!(
            text.contains(&block),
            "docs/writing-a-service.md quotes {file}, which no longer has:\n{block}"
        );
    }
}
