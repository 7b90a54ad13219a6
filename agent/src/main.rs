//! `aliaslb-agent`: entry point. The agent itself comes with the agent issue.

fn main() {
    eprintln!("aliaslb-agent: not implemented yet");
    std::process::exit(2);
}
