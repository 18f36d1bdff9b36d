//! `kpc cache keygen FILE`: an Ed25519 key pair for writer signatures (`KPC_CACHE_SIGNING_KEY` on
//! builders, FILE.pub in `KPC_CACHE_TRUSTED_KEYS` on every reader).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use kpc::SigningKey;
use serde_json::json;

#[derive(Args, Debug)]
pub struct KeygenArgs {
    /// Where to write the private key (mode 0600; never overwritten). The public key goes to FILE.pub.
    pub file: PathBuf,
    /// A comment stored after the public key (default: this host's id).
    #[arg(long)]
    pub comment: Option<String>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

pub fn keygen(config: &kpc::Config, args: &KeygenArgs) -> kpc::Result<ExitCode> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| {
        kpc::Error::Io(format!(
            "the operating system gave no random bytes for a key ({e})"
        ))
    })?;
    let comment = args
        .comment
        .clone()
        .unwrap_or_else(|| format!("kpc@{}", config.host_id()));
    let public = SigningKey::write_pair(&seed, &args.file, &comment)
        .map_err(|e| kpc::Error::Io(format!("writing the key pair: {e}")))?;
    seed.fill(0);
    let pub_file = format!("{}.pub", args.file.display());
    if args.json {
        crate::output::print_json(&json!({
            "private_key_file": args.file,
            "public_key_file": pub_file,
            "public_key": public.to_string(),
            "fingerprint": public.fingerprint(),
        }));
    } else {
        outln!(
            "private key: {} (mode 0600; give it to builders as KPC_CACHE_SIGNING_KEY)",
            args.file.display()
        );
        outln!("public key:  {pub_file} (give it to every reader in KPC_CACHE_TRUSTED_KEYS)");
        outln!("fingerprint: {}", public.fingerprint());
    }
    Ok(ExitCode::SUCCESS)
}
