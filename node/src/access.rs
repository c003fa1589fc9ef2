//! The node's API access flags (`--api-key`, `--chat-api-key`, `--api-key-file`,
//! `--cors-origin`) and the policy they make; the rules themselves are in
//! [`gateway::access`].

use anyhow::Context;
use clap::Args;
use gateway::AccessPolicy;
use std::path::PathBuf;

/// Who may use this node's HTTP API.
#[derive(Args, Debug, Clone, Default)]
pub struct AccessArgs {
    /// Require this key for the API (repeatable): an admin key, allowed every route. Clients
    /// send it as `Authorization: Bearer KEY` (or `x-api-key: KEY`). Without any key the API
    /// is open to whoever reaches the port. `shoal secret` prints a good key.
    #[arg(
        long = "api-key",
        env = "SHOAL_API_KEY",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_keys: Vec<String>,

    /// A key that may only chat (the chat, Messages, Responses and Ollama routes, model
    /// lists, cancel), not read the cluster's state or place and delete instances
    /// (repeatable).
    #[arg(
        long = "chat-api-key",
        env = "SHOAL_CHAT_API_KEY",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub chat_api_keys: Vec<String>,

    /// A file of keys, one per line: `KEY` or `admin KEY` for an admin key, `chat KEY` for a
    /// chat-only key; `#` starts a comment. Keeps keys out of the process list.
    #[arg(long, env = "SHOAL_API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,

    /// A web origin (scheme://host[:port]) whose pages may call this API from a browser,
    /// besides the node's own dashboard (repeatable); `*` allows every site, as exo does.
    #[arg(
        long = "cors-origin",
        env = "SHOAL_CORS_ORIGINS",
        value_delimiter = ','
    )]
    pub cors_origins: Vec<String>,
}

impl AccessArgs {
    /// The policy these flags ask for; an unreadable key file or a malformed key is an error
    /// that names the flag.
    pub fn policy(&self) -> anyhow::Result<AccessPolicy> {
        let mut admin = self.api_keys.clone();
        let mut chat = self.chat_api_keys.clone();
        if let Some(path) = &self.api_key_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --api-key-file {}", path.display()))?;
            let (more_admin, more_chat) = gateway::access::parse_key_file(&text)
                .with_context(|| format!("--api-key-file {}", path.display()))?;
            admin.extend(more_admin);
            chat.extend(more_chat);
        }
        // Each list on its own first, so that the error names the flag at fault.
        AccessPolicy::new(&admin, &[], &[])
            .context("--api-key (SHOAL_API_KEY) or --api-key-file")?;
        AccessPolicy::new(&[], &chat, &[])
            .context("--chat-api-key (SHOAL_CHAT_API_KEY) or --api-key-file")?;
        AccessPolicy::new(&admin, &chat, &self.cors_origins).context("--cors-origin")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_adds_to_the_flags() {
        let file = std::env::temp_dir().join(format!("shoal-keys-{}", std::process::id()));
        std::fs::write(
            &file,
            "# ops\nadmin-0123456789abcdef\nchat chat-0123456789abcdef\n",
        )
        .unwrap();
        let args = AccessArgs {
            api_key_file: Some(file.clone()),
            ..AccessArgs::default()
        };
        assert!(args.policy().unwrap().has_keys());
        std::fs::write(&file, "chat\n").unwrap();
        let err = format!("{:#}", args.policy().unwrap_err());
        assert!(err.contains("line 1"), "{err}");
        let _ = std::fs::remove_file(&file);
        let none = AccessArgs::default().policy().unwrap();
        assert!(!none.has_keys());
        let bad = AccessArgs {
            api_keys: vec!["short".into()],
            ..AccessArgs::default()
        };
        let err = format!("{:#}", bad.policy().unwrap_err());
        assert!(err.contains("--api-key (SHOAL_API_KEY)"), "{err}");
        assert!(!err.contains("--cors-origin"), "{err}");
        let bad_chat = AccessArgs {
            chat_api_keys: vec!["short".into()],
            ..AccessArgs::default()
        };
        let err = format!("{:#}", bad_chat.policy().unwrap_err());
        assert!(err.contains("--chat-api-key"), "{err}");
    }
}
