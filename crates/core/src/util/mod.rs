//! Small shared pieces: YAML with positions, time formatting, hashing,
//! suggestions for typos.

pub mod hash;
pub mod suggest;
pub mod time;
pub mod yaml;

/// Lock a mutex, taking over the data a panicking thread left behind:
/// every lock in Runbook guards data that is valid between any two of its
/// statements, and a panic is caught and reported where it happens.
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Read-lock an `RwLock`, as [`lock`] does a mutex.
pub fn read<T>(l: &std::sync::RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

/// Write-lock an `RwLock`, as [`lock`] does a mutex.
pub fn write<T>(l: &std::sync::RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}
